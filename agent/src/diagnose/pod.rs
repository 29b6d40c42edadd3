//! `keelson diagnose pod NS/NAME`: the chain of one pod on this node, in
//! kubelet's order (`SyncPod`: admission, volumes mounted before the
//! sandbox, the sandbox, images, containers, then probes and readiness),
//! with eviction risk checked whatever happened before. Each link reads
//! the API's copy of the pod, the runtime (CRI) and, when it answers, the
//! daemon (probe results, back-off timers, the Events it recorded).

use std::path::Path;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    ConfigMap, Container, ContainerStatus, Node, PersistentVolumeClaim, Pod, PodStatus, Secret,
};

use super::SubjectError;
use super::api::Lookup;
use super::context::Context;
use super::history::{self, Subject};
use super::logs;
use super::report::{Link, Mark, Part, Report, Target, cut_after_failure};
use super::runtime::{self as rt, PodRuntime};
use super::thresholds;
use super::words;
use crate::introspection::types::{PodState, TimelineRecord};
use crate::node::pod::podutil;
use crate::node::pod::qos::{QosClass, pod_qos};

/// Log lines of a crashed container's previous instance shown.
pub const PREVIOUS_LOG_LINES: usize = 20;

/// Waiting reasons of image pulls (kubelet's `ErrImagePull` family).
const IMAGE_REASONS: [&str; 5] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "ImageInspectError",
];

/// Everything the links read, gathered once.
struct Facts<'a> {
    ctx: &'a Context,
    pod: Pod,
    status: PodStatus,
    daemon: Option<PodState>,
    runtime: Result<PodRuntime, rt::RuntimeError>,
    records: Vec<TimelineRecord>,
    from_daemon_only: bool,
}

impl Facts<'_> {
    fn ns(&self) -> &str {
        podutil::namespace(&self.pod)
    }

    fn name(&self) -> &str {
        podutil::name(&self.pod)
    }

    fn containers(&self) -> impl Iterator<Item = &Container> {
        podutil::init_containers(&self.pod)
            .iter()
            .chain(podutil::containers(&self.pod).iter())
    }

    fn status_of(&self, name: &str) -> Option<&ContainerStatus> {
        self.status
            .init_container_statuses
            .iter()
            .flatten()
            .chain(self.status.container_statuses.iter().flatten())
            .find(|s| s.name == name)
    }

    fn daemon_container(&self, name: &str) -> Option<&crate::introspection::types::ContainerState> {
        self.daemon
            .as_ref()?
            .containers
            .iter()
            .find(|c| c.name == name)
    }

    fn running(&self) -> bool {
        self.runtime
            .as_ref()
            .is_ok_and(|r| r.ready_sandbox().is_some())
            && self
                .status
                .container_statuses
                .iter()
                .flatten()
                .any(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
    }

    fn terminal(&self) -> bool {
        matches!(
            self.status.phase.as_deref(),
            Some("Succeeded") | Some("Failed")
        )
    }
}

/// Diagnoses pod `namespace/name`; `Err` is a one-line error (unknown pod).
pub async fn diagnose(ctx: &Context, namespace: &str, name: &str) -> Result<Report, SubjectError> {
    let (ns, nm) = (namespace.to_string(), name.to_string());
    let lookup = match &ctx.api {
        Some(api) => api.get::<Pod>(namespace, name, "the pod").await,
        None => Lookup::Failed(ctx.api_error.clone().unwrap_or_default()),
    };
    let daemon = match ctx.daemon() {
        Some(d) => d.pod(namespace, name).await.ok().flatten(),
        None => None,
    };
    let (pod, from_daemon_only) = match (lookup, daemon.as_ref().and_then(|d| d.pod.clone())) {
        (Lookup::Found(p), _) => (p, false),
        (_, Some(p)) => (p, true),
        (Lookup::NotFound, None) => {
            return Err(SubjectError::NotFound {
                kind: "pod",
                namespace: ns,
                name: nm,
            });
        }
        (Lookup::Forbidden(m), None) => {
            return Err(SubjectError::PodNotOnNode {
                namespace: ns,
                name: nm,
                node: ctx.node.clone(),
                reason: m,
            });
        }
        (Lookup::Failed(e), None) => {
            return Err(SubjectError::PodUnreadable {
                namespace: ns,
                name: nm,
                reason: e,
            });
        }
    };
    let status = if from_daemon_only {
        daemon
            .as_ref()
            .and_then(|d| d.status.clone())
            .unwrap_or_default()
    } else {
        pod.status.clone().unwrap_or_default()
    };
    let uid = podutil::uid(&pod).to_string();
    let runtime = match &ctx.cri {
        Some(cri) => rt::pod_runtime(cri, &uid).await,
        None => Err(rt::RuntimeError::NotConfigured),
    };
    let records = history::gather(
        ctx,
        &Subject {
            kind: "Pod",
            namespace: Some(namespace),
            name,
            uid: Some(&uid),
        },
    )
    .await;
    let facts = Facts {
        ctx,
        pod,
        status,
        daemon,
        runtime,
        records,
        from_daemon_only,
    };
    let mut links = vec![
        bound(&facts),
        admitted(&facts),
        volumes(&facts).await,
        sandbox(&facts),
        images(&facts).await,
        containers(&facts),
        probes(&facts),
        readiness_gates(&facts),
    ];
    links.push(eviction_risk(&facts).await);
    cut_after_failure(&mut links, &["evictionRisk"]);
    let mut report = ctx.report(Target::pod(namespace, name), links);
    if let Some(since) = ctx.since {
        report.timeline = Some(history::since(&facts.records, since));
    }
    Ok(report)
}

fn bound(f: &Facts<'_>) -> Link {
    const T: &str = "Bound to this node";
    let node = podutil::spec(&f.pod).node_name.clone().unwrap_or_default();
    if f.from_daemon_only {
        return Link::new(
            "bound",
            T,
            Mark::Ok,
            "this node runs it (the API server cannot be read: from the keelson daemon's copy)",
        );
    }
    if node.is_empty() {
        return Link::new(
            "bound",
            T,
            Mark::Failed,
            "not scheduled: spec.nodeName is empty",
        )
        .with_next(format!(
            "kubectl describe pod -n {} {}: the scheduler's FailedScheduling events",
            f.ns(),
            f.name()
        ));
    }
    if node != f.ctx.node {
        return Link::new(
            "bound",
            T,
            Mark::Failed,
            format!("bound to node {node}, not to {}", f.ctx.node),
        )
        .with_next(format!(
            "run `keelson diagnose pod {}/{}` on node {node}",
            f.ns(),
            f.name()
        ));
    }
    Link::new("bound", T, Mark::Ok, format!("spec.nodeName is {node}"))
}

fn admitted(f: &Facts<'_>) -> Link {
    const T: &str = "Admitted";
    let message = f.status.message.clone().unwrap_or_default();
    if f.status.phase.as_deref() == Some("Failed") && message.starts_with("Pod was rejected: ") {
        let reason = f.status.reason.clone().unwrap_or_default();
        return Link::new("admitted", T, Mark::Failed, format!("rejected: {reason}"))
            .with_evidence([format!(
                "Status: Failed, Reason: {reason}, Message: {message}"
            )]);
    }
    match f.daemon.as_ref().and_then(|d| d.worker_phase.clone()) {
        Some(phase) => Link::new(
            "admitted",
            T,
            Mark::Ok,
            format!("admitted: a pod worker runs it ({phase})"),
        ),
        None => Link::new(
            "admitted",
            T,
            Mark::Ok,
            format!(
                "not rejected (status.phase {})",
                f.status.phase.as_deref().unwrap_or("Pending")
            ),
        ),
    }
}

/// A volume that names an API object.
struct ObjectRef {
    volume: String,
    kind: &'static str,
    object: String,
    optional: bool,
}

fn object_refs(pod: &Pod) -> Vec<ObjectRef> {
    let mut out = Vec::new();
    for v in podutil::spec(pod).volumes.iter().flatten() {
        let mut add = |kind, object: Option<&String>, optional: Option<bool>| {
            if let Some(o) = object {
                out.push(ObjectRef {
                    volume: v.name.clone(),
                    kind,
                    object: o.clone(),
                    optional: optional.unwrap_or(false),
                });
            }
        };
        if let Some(c) = &v.config_map {
            add("configmap", Some(&c.name), c.optional);
        }
        if let Some(s) = &v.secret {
            add("secret", s.secret_name.as_ref(), s.optional);
        }
        if let Some(p) = &v.persistent_volume_claim {
            add("persistentvolumeclaim", Some(&p.claim_name), None);
        }
        for src in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            if let Some(c) = &src.config_map {
                add("configmap", Some(&c.name), c.optional);
            }
            if let Some(s) = &src.secret {
                add("secret", Some(&s.name), s.optional);
            }
        }
    }
    out
}

async fn volumes(f: &Facts<'_>) -> Link {
    const T: &str = "Volumes ready";
    let count = podutil::spec(&f.pod).volumes.as_ref().map_or(0, Vec::len);
    let mut parts = Vec::new();
    for r in object_refs(&f.pod) {
        let Some(api) = f.ctx.api.as_ref() else {
            continue;
        };
        let what = format!("volume {:?}", r.volume);
        let found = match r.kind {
            "configmap" => api
                .get::<ConfigMap>(f.ns(), &r.object, &what)
                .await
                .map(drop),
            "secret" => api.get::<Secret>(f.ns(), &r.object, &what).await.map(drop),
            _ => api
                .get::<PersistentVolumeClaim>(f.ns(), &r.object, &what)
                .await
                .map(drop),
        };
        let name = format!("{} ({} {:?})", r.volume, r.kind, r.object);
        let (status, summary) = match found {
            Lookup::Found(()) => (Mark::Ok, "exists".to_string()),
            Lookup::NotFound if r.optional => (Mark::Ok, "absent (optional)".to_string()),
            Lookup::NotFound => (Mark::Failed, format!("{} {:?} not found", r.kind, r.object)),
            Lookup::Forbidden(m) => (Mark::Unknown, format!("cannot be read: {m}")),
            Lookup::Failed(e) => (Mark::Unknown, format!("cannot be read: {e}")),
        };
        parts.push(Part {
            name,
            status,
            summary,
            evidence: Vec::new(),
        });
    }
    let set_up = f.running() || f.terminal();
    let failed_mount = history::latest(&f.records, "FailedMount", "MountVolume.SetUp failed", None)
        .or_else(|| history::latest(&f.records, "FailedMount", "", None));
    let mut link = if set_up {
        Link::new("volumes", T, Mark::Ok, format!("{count} volume(s) set up"))
    } else if let Some(p) = parts.iter().find(|p| p.status == Mark::Failed) {
        Link::new(
            "volumes",
            T,
            Mark::Failed,
            format!(
                "MountVolume.SetUp failed for volume {:?} : {}",
                p.name.split(' ').next().unwrap_or_default(),
                p.summary
            ),
        )
    } else if let Some(r) = failed_mount {
        Link::new("volumes", T, Mark::Failed, r.message.clone())
    } else {
        let worst = Link::worst_part(&parts);
        Link::new(
            "volumes",
            T,
            worst,
            match worst {
                Mark::Ok => format!("{count} volume(s); their objects exist"),
                _ => "some objects cannot be read".to_string(),
            },
        )
    };
    if let Some(r) = failed_mount.filter(|_| !set_up) {
        link.evidence
            .push(format!("FailedMount ({}): {}", when(&r.time), r.message));
    }
    if link.status == Mark::Failed {
        link.next = Some(format!(
            "create the missing object in namespace {}, or mark the volume optional; kubelet retries the mount by itself",
            f.ns()
        ));
    }
    link.parts = parts;
    link
}

fn when(rfc: &str) -> String {
    words::parse_time(rfc)
        .map(words::relative)
        .unwrap_or_else(|| rfc.to_string())
}

fn sandbox(f: &Facts<'_>) -> Link {
    const T: &str = "Sandbox";
    let rt = match &f.runtime {
        Ok(r) => r,
        Err(e) => {
            return Link::new(
                "sandbox",
                T,
                Mark::Unknown,
                format!("the container runtime does not answer: {e}"),
            )
            .with_next("keelson diagnose node");
        }
    };
    let failed = history::latest(&f.records, "FailedCreatePodSandBox", "", None);
    if let Some(s) = rt.ready_sandbox() {
        let short = &s.id[..s.id.len().min(13)];
        let ip = if podutil::is_host_network(&f.pod) {
            "host network".to_string()
        } else if s.ip.is_empty() {
            "no pod IP".to_string()
        } else {
            format!("pod IP {}", s.ip)
        };
        return Link::new(
            "sandbox",
            T,
            Mark::Ok,
            format!("ready, {ip} (sandbox {short})"),
        );
    }
    if f.terminal() {
        return Link::new(
            "sandbox",
            T,
            Mark::Ok,
            format!(
                "pod finished (phase {}): its sandbox is released",
                f.status.phase.as_deref().unwrap_or_default()
            ),
        );
    }
    if let Some(r) = failed {
        return Link::new("sandbox", T, Mark::Failed, "FailedCreatePodSandBox")
            .with_evidence([format!(
                "FailedCreatePodSandBox ({}): {}",
                when(&r.time),
                r.message
            )])
            .with_next(
                "the runtime's CNI plugin: keelson diagnose node (CNI config), containerd's log",
            );
    }
    match rt.sandboxes.first() {
        Some(s) => Link::new(
            "sandbox",
            T,
            Mark::Failed,
            format!("sandbox {} is not ready", &s.id[..s.id.len().min(13)]),
        ),
        None => Link::new("sandbox", T, Mark::Warning, "no sandbox yet"),
    }
}

async fn images(f: &Facts<'_>) -> Link {
    const T: &str = "Images pulled";
    let secrets: Vec<String> = podutil::spec(&f.pod)
        .image_pull_secrets
        .iter()
        .flatten()
        .map(|s| s.name.clone())
        .collect();
    let creds = if secrets.is_empty() {
        "credentials: none (no imagePullSecrets: an anonymous pull)".to_string()
    } else {
        format!("credentials: imagePullSecrets {}", secrets.join(", "))
    };
    let mut parts = Vec::new();
    for c in f.containers() {
        let image = c.image.clone().unwrap_or_default();
        let waiting = f
            .status_of(&c.name)
            .and_then(|s| s.state.as_ref())
            .and_then(|s| s.waiting.as_ref())
            .filter(|w| IMAGE_REASONS.contains(&w.reason.as_deref().unwrap_or_default()));
        let mut evidence = Vec::new();
        let present = match &f.ctx.cri {
            Some(cri) => rt::image_present(cri, &image).await,
            None => Err(rt::RuntimeError::NotConfigured),
        };
        let (status, summary) = if let Some(w) = waiting {
            let reason = w.reason.clone().unwrap_or_default();
            if let Some(m) = w.message.as_deref().filter(|m| !m.is_empty()) {
                evidence.push(format!("State: Waiting, Reason: {reason}, Message: {m}"));
            }
            if let Some(r) =
                history::latest(&f.records, "Failed", "Failed to pull image", Some(&c.name))
            {
                evidence.push(format!("Failed ({}): {}", when(&r.time), r.message));
            }
            if let Some(b) = f
                .daemon_container(&c.name)
                .and_then(|d| d.pull_backoff.as_ref())
            {
                evidence.push(format!(
                    "next pull attempt {} (image pull back-off {}s)",
                    b.until.as_deref().map(when).unwrap_or_default(),
                    b.delay_seconds
                ));
            }
            evidence.push(creds.clone());
            (Mark::Failed, format!("{image}: {reason}"))
        } else {
            match present {
                Ok(Some(id)) => (Mark::Ok, format!("{image} present ({})", short_id(&id))),
                Ok(None) => {
                    let pulling =
                        history::latest(&f.records, "Pulling", "Pulling image", Some(&c.name));
                    match pulling {
                        Some(r) => (
                            Mark::Warning,
                            format!("{image}: pulling since {}", when(&r.time)),
                        ),
                        None => (Mark::Warning, format!("{image}: not present yet")),
                    }
                }
                Err(e) => (
                    Mark::Unknown,
                    format!("{image}: the runtime does not answer: {e}"),
                ),
            }
        };
        parts.push(Part {
            name: c.name.clone(),
            status,
            summary,
            evidence,
        });
    }
    let worst = Link::worst_part(&parts);
    let summary = match worst {
        Mark::Failed => parts
            .iter()
            .find(|p| p.status == Mark::Failed)
            .map(|p| p.summary.clone())
            .unwrap_or_default(),
        Mark::Ok => format!("{} image(s) present", parts.len()),
        _ => "not all images are present".to_string(),
    };
    let mut link = Link::new("images", T, worst, summary);
    if worst == Mark::Failed {
        link.next = Some(
            "check the image name and tag, that the registry is reachable from the node and the pull credentials (imagePullSecrets)".into(),
        );
    }
    link.parts = parts;
    link
}

fn short_id(id: &str) -> String {
    let bare = id.strip_prefix("sha256:").unwrap_or(id);
    format!("sha256:{}", &bare[..bare.len().min(12)])
}

fn memory_limit(c: &Container) -> Option<String> {
    c.resources
        .as_ref()?
        .limits
        .as_ref()?
        .get("memory")
        .map(|q| q.0.clone())
}

fn previous_log(f: &Facts<'_>, c: &Container, status: &ContainerStatus) -> Vec<String> {
    let Ok(rt) = &f.runtime else {
        return Vec::new();
    };
    let running_id = status
        .container_id
        .as_deref()
        .and_then(|id| id.split("://").nth(1))
        .filter(|_| status.state.as_ref().is_some_and(|s| s.running.is_some()));
    let Some(prev) = rt
        .of(&c.name)
        .find(|i| i.state == "CONTAINER_EXITED" && Some(i.id.as_str()) != running_id)
    else {
        return Vec::new();
    };
    if prev.log_path.is_empty() {
        return Vec::new();
    }
    match logs::tail(Path::new(&prev.log_path), PREVIOUS_LOG_LINES) {
        Ok(lines) if lines.is_empty() => {
            vec![format!(
                "the previous instance wrote nothing ({})",
                prev.log_path
            )]
        }
        Ok(lines) => {
            let mut out = vec![format!(
                "last {} log line(s) of the previous instance ({}):",
                lines.len(),
                prev.log_path
            )];
            out.extend(lines.into_iter().map(|l| format!("| {l}")));
            vec![out.join("\n")]
        }
        Err(e) => vec![format!("its log {} cannot be read: {e}", prev.log_path)],
    }
}

fn oom_note(c: &Container, status: &ContainerStatus) -> Option<String> {
    let oom = |s: Option<&k8s_openapi::api::core::v1::ContainerState>| {
        s.and_then(|s| s.terminated.as_ref())
            .is_some_and(|t| t.reason.as_deref() == Some("OOMKilled"))
    };
    if !oom(status.state.as_ref()) && !oom(status.last_state.as_ref()) {
        return None;
    }
    Some(match memory_limit(c) {
        Some(l) => format!(
            "OOMKilled: the kernel killed the container for using more than its memory limit ({l}); raise resources.limits.memory or use less memory"
        ),
        None => "OOMKilled: the kernel killed the container for lack of memory (it has no memory limit: the pod's or the node's memory ran out)".to_string(),
    })
}

fn container_part(f: &Facts<'_>, c: &Container) -> Part {
    let Some(s) = f.status_of(&c.name) else {
        return Part {
            name: c.name.clone(),
            status: Mark::Warning,
            summary: "no status yet (not created)".into(),
            evidence: Vec::new(),
        };
    };
    let mut evidence = Vec::new();
    let state = s.state.clone().unwrap_or_default();
    let last = s
        .last_state
        .as_ref()
        .filter(|l| l.terminated.is_some())
        .map(words::describe_state);
    if let Some(l) = &last {
        evidence.push(format!("Last State: {l}"));
    }
    let oom = oom_note(c, s);
    if let Some(o) = &oom {
        evidence.push(o.clone());
    }
    let restarts = s.restart_count;
    let is_init = podutil::is_init_container(&f.pod, &c.name) && !podutil::is_restartable_init(c);
    let (status, summary) = if state.running.is_some() {
        if restarts == 0 {
            (Mark::Ok, words::describe_state(&state))
        } else {
            (
                Mark::Warning,
                format!(
                    "Running, Restart Count: {restarts}{}",
                    if oom.is_some() {
                        " (last exit: OOMKilled)"
                    } else {
                        ""
                    }
                ),
            )
        }
    } else if let Some(w) = &state.waiting {
        let reason = w.reason.clone().unwrap_or_default();
        if let Some(m) = w.message.as_deref().filter(|m| !m.is_empty()) {
            evidence.insert(0, format!("State: Waiting, Reason: {reason}, Message: {m}"));
        }
        match reason.as_str() {
            "CrashLoopBackOff" => {
                evidence.extend(next_start(f, c));
                evidence.extend(previous_log(f, c, s));
                let why = if oom.is_some() {
                    ", last exit OOMKilled"
                } else {
                    ""
                };
                (
                    Mark::Failed,
                    format!("Waiting: CrashLoopBackOff, Restart Count: {restarts}{why}"),
                )
            }
            "ContainerCreating" | "PodInitializing" | "" => (
                Mark::Warning,
                format!(
                    "Waiting: {}",
                    if reason.is_empty() {
                        "ContainerCreating"
                    } else {
                        &reason
                    }
                ),
            ),
            r if IMAGE_REASONS.contains(&r) => (Mark::Failed, format!("Waiting: {r}")),
            r => (Mark::Failed, format!("Waiting: {r}")),
        }
    } else if let Some(t) = &state.terminated {
        let reason = t.reason.clone().unwrap_or_else(|| "Error".into());
        if let Some(next) = next_start(f, c) {
            // kubelet (and keelson) write `terminated` through a restart
            // back-off and `waiting: CrashLoopBackOff` only at the sync that
            // ends it (pkg/kubelet/pod_workers.go requeues a back-off at its
            // expiry; the reason cache of kubelet.go fills the waiting
            // reason at the next sync): the node knows the loop sooner.
            evidence.insert(
                0,
                format!(
                    "State: Terminated, Reason: {reason}, Exit Code: {}",
                    t.exit_code
                ),
            );
            evidence.push(next);
            evidence.extend(previous_log_of_terminated(f, c));
            let why = if oom.is_some() {
                ", last exit OOMKilled"
            } else {
                ""
            };
            (
                Mark::Failed,
                format!(
                    "CrashLoopBackOff (the API shows Terminated until the back-off ends), Restart Count: {restarts}{why}"
                ),
            )
        } else if t.exit_code == 0 {
            (Mark::Ok, words::describe_state(&state))
        } else {
            evidence.extend(previous_log_of_terminated(f, c));
            (
                Mark::Failed,
                format!("Terminated: {reason}, Exit Code: {}", t.exit_code),
            )
        }
    } else {
        (Mark::Warning, "Waiting".into())
    };
    let name = if is_init {
        format!("{} (init)", c.name)
    } else {
        c.name.clone()
    };
    Part {
        name,
        status,
        summary,
        evidence,
    }
}

/// "next start ..." while the running daemon holds the container in its
/// restart back-off.
fn next_start(f: &Facts<'_>, c: &Container) -> Option<String> {
    let b = f.daemon_container(&c.name)?.restart_backoff.as_ref()?;
    Some(format!(
        "next start {} (back-off {}s, doubling to 5m0s)",
        b.until.as_deref().map(when).unwrap_or_default(),
        b.delay_seconds
    ))
}

/// The log of a container that ended for good (its newest instance).
fn previous_log_of_terminated(f: &Facts<'_>, c: &Container) -> Vec<String> {
    let Ok(rt) = &f.runtime else {
        return Vec::new();
    };
    let Some(i) = rt.of(&c.name).next() else {
        return Vec::new();
    };
    match logs::tail(Path::new(&i.log_path), PREVIOUS_LOG_LINES) {
        Ok(lines) if !lines.is_empty() => {
            let mut out = vec![format!(
                "last {} log line(s) ({}):",
                lines.len(),
                i.log_path
            )];
            out.extend(lines.into_iter().map(|l| format!("| {l}")));
            vec![out.join("\n")]
        }
        _ => Vec::new(),
    }
}

fn containers(f: &Facts<'_>) -> Link {
    const T: &str = "Containers";
    let parts: Vec<Part> = f.containers().map(|c| container_part(f, c)).collect();
    let worst = Link::worst_part(&parts);
    let summary = match parts
        .iter()
        .find(|p| p.status == worst && worst != Mark::Ok)
    {
        Some(p) => format!("{}: {}", p.name, p.summary),
        None => format!("{} container(s) running", parts.len()),
    };
    let mut link = Link::new("containers", T, worst, summary);
    if f.ctx.daemon().is_none() && f.ctx.socket.is_some() && !f.terminal() {
        link.evidence.push(
            "the keelson daemon is down: the status the API server has is the last one keelson wrote, and nothing restarts the containers until it runs again".to_string(),
        );
    }
    if let Some(p) = parts.iter().find(|p| p.status == Mark::Failed) {
        let name = p.name.trim_end_matches(" (init)");
        // `--previous` reads the instance before a restart; a container
        // that ended for good is read as it is.
        let restarted = f.status_of(name).is_some_and(|s| {
            s.restart_count > 0 && s.state.as_ref().is_none_or(|st| st.terminated.is_none())
        });
        link.next = Some(format!(
            "kubectl logs -n {} {} -c {name}{}",
            f.ns(),
            f.name(),
            if restarted { " --previous" } else { "" }
        ));
    }
    link.parts = parts;
    link
}

fn probes(f: &Facts<'_>) -> Link {
    const T: &str = "Probes";
    let mut parts = Vec::new();
    for c in podutil::containers(&f.pod) {
        let status = f.status_of(&c.name);
        let running = status
            .and_then(|s| s.state.as_ref())
            .is_some_and(|s| s.running.is_some());
        let daemon = f.daemon_container(&c.name);
        for (kind, probe) in [
            ("startup", c.startup_probe.as_ref()),
            ("liveness", c.liveness_probe.as_ref()),
            ("readiness", c.readiness_probe.as_ref()),
        ] {
            let Some(probe) = probe else { continue };
            let title = format!("{}{}", kind[..1].to_uppercase(), &kind[1..]);
            let mut evidence = vec![format!("{title}: {}", words::describe_probe(probe))];
            let failure = history::latest(
                &f.records,
                "Unhealthy",
                &format!("{title} probe failed"),
                Some(&c.name),
            );
            let recovered = daemon
                .and_then(|d| d.probes.iter().find(|p| p.kind == kind))
                .is_some_and(|p| p.result == "Success");
            if let Some(r) = failure {
                evidence.push(format!(
                    "last failure ({}{}): {}",
                    when(&r.time),
                    if recovered { ", passing since" } else { "" },
                    r.message
                ));
            }
            let result = daemon
                .and_then(|d| d.probes.iter().find(|p| p.kind == kind))
                .map(|p| p.result.clone());
            let (mark, summary) = if !running {
                (Mark::NotReached, "container not running".to_string())
            } else {
                match result.as_deref() {
                    Some("Success") => (Mark::Ok, "Success".to_string()),
                    Some("Failure") => (Mark::Failed, "Failure".to_string()),
                    Some(_) => (Mark::Warning, "no result yet".to_string()),
                    None if kind == "readiness" => match status.map(|s| s.ready) {
                        Some(true) => (Mark::Ok, "Success (container ready)".to_string()),
                        _ => (
                            Mark::Failed,
                            "Failure (container not ready; the daemon is down, so this is read from the pod status)"
                                .to_string(),
                        ),
                    },
                    None if kind == "startup" => match status.and_then(|s| s.started) {
                        Some(true) => (Mark::Ok, "Success (container started)".to_string()),
                        _ => (Mark::Warning, "not passed yet".to_string()),
                    },
                    None => (Mark::Ok, "no failure reported".to_string()),
                }
            };
            parts.push(Part {
                name: format!("{} {kind}", c.name),
                status: mark,
                summary,
                evidence,
            });
        }
    }
    if parts.is_empty() {
        return Link::new("probes", T, Mark::Ok, "no probes");
    }
    let worst = Link::worst_part(&parts);
    let summary = match parts.iter().find(|p| p.status == Mark::Failed) {
        Some(p) => format!("{} probe: {}", p.name, p.summary),
        None => format!(
            "{} probe(s) pass",
            parts.iter().filter(|p| p.status == Mark::Ok).count()
        ),
    };
    let mut link = Link::new("probes", T, worst, summary);
    if worst == Mark::Failed {
        link.next = Some(format!(
            "the probe's endpoint in the container (kubectl exec -n {} {} -- ...), or its thresholds",
            f.ns(),
            f.name()
        ));
    }
    link.parts = parts;
    link
}

fn readiness_gates(f: &Facts<'_>) -> Link {
    const T: &str = "Readiness gates";
    let gates: Vec<String> = podutil::spec(&f.pod)
        .readiness_gates
        .iter()
        .flatten()
        .map(|g| g.condition_type.clone())
        .collect();
    if gates.is_empty() {
        return Link::new("readinessGates", T, Mark::Ok, "none");
    }
    let mut parts = Vec::new();
    for g in &gates {
        let cond = f.status.conditions.iter().flatten().find(|c| &c.type_ == g);
        let (status, summary) = match cond {
            Some(c) if c.status == "True" => (Mark::Ok, "True".to_string()),
            Some(c) => (
                Mark::Failed,
                format!("{} ({})", c.status, c.reason.clone().unwrap_or_default()),
            ),
            None => (Mark::Failed, "no such condition yet".to_string()),
        };
        parts.push(Part {
            name: g.clone(),
            status,
            summary,
            evidence: Vec::new(),
        });
    }
    let worst = Link::worst_part(&parts);
    let mut link = Link::new(
        "readinessGates",
        T,
        worst,
        if worst == Mark::Ok {
            format!("{} gate(s) True", parts.len())
        } else {
            "a readiness gate is not True".into()
        },
    );
    if worst == Mark::Failed {
        link.next = Some(
            "the controller that owns the gate's condition sets it (not the node): kubectl get pod -o yaml, status.conditions".into(),
        );
    }
    link.parts = parts;
    link
}

async fn eviction_risk(f: &Facts<'_>) -> Link {
    const T: &str = "Eviction risk";
    let qos = pod_qos(&f.pod);
    let mut evidence = vec![format!(
        "QoS Class: {}{}",
        qos.as_str(),
        match qos {
            QosClass::BestEffort => " (evicted first under memory pressure)",
            QosClass::Burstable => " (evicted after BestEffort pods, by usage above requests)",
            QosClass::Guaranteed => " (evicted last)",
        }
    )];
    let mut status = Mark::Ok;
    let mut summary = "no pressure on the node".to_string();
    // The node's conditions as the API has them.
    if let Some(api) = &f.ctx.api
        && let Lookup::Found(node) = api
            .get_cluster::<Node>(&f.ctx.node, "the node's conditions")
            .await
    {
        let pressure: Vec<String> = node
            .status
            .iter()
            .flat_map(|s| s.conditions.iter().flatten())
            .filter(|c| c.type_.ends_with("Pressure") && c.status == "True")
            .map(|c| c.type_.clone())
            .collect();
        if !pressure.is_empty() {
            status = Mark::Failed;
            summary = format!(
                "the node has {}: kubelet evicts pods until it clears",
                pressure.join(", ")
            );
        }
    }
    // Measured now, as the eviction manager measures.
    let pods = [Arc::new(f.pod.clone())];
    if let Some((summary_now, readings)) = thresholds::measure(f.ctx, &pods).await {
        for r in &readings {
            let kind = r.kind;
            evidence.push(format!(
                "{}: {} available, {kind} threshold {}",
                r.signal, r.available, r.limit
            ));
            if r.below && status != Mark::Failed {
                status = Mark::Failed;
                summary = format!("{} is below its {kind} threshold", r.signal);
            } else if r.near && status == Mark::Ok {
                status = Mark::Warning;
                summary = format!("{} is within twice its threshold", r.signal);
            }
        }
        if let Some(p) = summary_now.pods.get(podutil::uid(&f.pod)) {
            if let Some(ws) = p.memory_working_set {
                evidence.push(format!(
                    "pod memory working set: {}",
                    words::bytes(ws as i64)
                ));
            }
            let eph = p.ephemeral_storage_used();
            if eph > 0 {
                evidence.push(format!(
                    "pod ephemeral storage: {}",
                    words::bytes(eph as i64)
                ));
            }
        }
    }
    Link::new("evictionRisk", T, status, summary).with_evidence(evidence)
}
