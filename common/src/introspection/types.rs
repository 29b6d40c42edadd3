//! What the daemon serves on its diagnose socket, as JSON. The same types
//! are read back by `keelson diagnose` (`keelson::diagnose::daemon`), so the
//! two sides of the socket cannot drift apart. Times are RFC 3339 strings
//! (UTC); durations are milliseconds.

use serde::{Deserialize, Serialize};

/// `GET /v1/info`: which daemon answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct DaemonInfo {
    /// keelson's version.
    pub version: String,
    /// The Kubernetes version it implements.
    pub kubernetes_version: String,
    /// The node name it runs as.
    pub node_name: String,
    /// Its process id.
    pub pid: u32,
    /// When it started.
    pub started_at: String,
    /// The roles it runs (`node`, `proxy`).
    pub roles: Vec<String>,
    /// `proxy.mode` when the proxy role runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_mode: Option<String>,
    /// What it was started with, for `keelson diagnose` run without
    /// `--config`/`--kubeconfig` (the socket is root's only, as the files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_with: Option<StartedWith>,
}

/// The configuration a daemon runs with and where its credentials are: its
/// command line may have given them (`--kubeconfig`, `--kubelet-config`),
/// which no file on the node records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct StartedWith {
    /// The files it read (`--config`, `--kubelet-config`, `--proxy-config`,
    /// `--kubeadm-flags`), in that order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<String>,
    /// The node role's kubeconfig, when one was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_kubeconfig: Option<String>,
    /// The proxy role's kubeconfig, when one was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_kubeconfig: Option<String>,
    /// The effective configuration (a KeelsonConfiguration, YAML: what
    /// `keelson check-config` prints for the same sources).
    pub config: String,
}

/// How a kind of API request fared lately (from the daemon's own request
/// log: every request its clients sent, with outcome and latency).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ApiCallStats {
    /// Requests seen.
    pub requests: u64,
    /// Of which failed (no answer, or an HTTP status >= 400 other than 404/409).
    pub failures: u64,
    /// The last request that succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_success: Option<String>,
    /// The last request of any outcome.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_attempt: Option<String>,
    /// The last failure's time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<String>,
    /// The last failure's error (`connection refused`, `HTTP 503`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Failures since the last success.
    pub consecutive_failures: u64,
    /// Latency of the last answered request, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_latency_ms: Option<u64>,
    /// Highest latency among the recent answered requests, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_recent_latency_ms: Option<u64>,
}

/// `GET /v1/node`: the node role's view of its own health.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct NodeState {
    /// Whether the node role runs in this daemon.
    pub node_role: bool,
    /// Runtime errors the Ready condition reports (`container runtime is down`, ...).
    pub runtime_errors: Vec<String>,
    /// Network errors (`container runtime network not ready: ...`).
    pub network_errors: Vec<String>,
    /// PLEG health: `None` when healthy or not started, else kubelet's text
    /// (`pleg was last seen active 3m0s ago; threshold is 3m0s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pleg_error: Option<String>,
    /// Whether the pod lifecycle started (it waits for the runtime).
    pub pods_started: bool,
    /// Pods with a worker.
    pub pod_workers: usize,
    /// Lease renewals (`kube-node-lease/<node>`).
    pub lease: ApiCallStats,
    /// Node status writes (`nodes/<node>/status`).
    pub node_status: ApiCallStats,
    /// Every request of the node role's client.
    pub api: ApiCallStats,
}

/// One container as the daemon holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ContainerState {
    /// Container name.
    pub name: String,
    /// The runtime's id of its newest instance, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// Current probe results (`readiness: Failure`), for each probe it has.
    pub probes: Vec<ProbeState>,
    /// The CrashLoopBackOff delay now in force, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_backoff: Option<Backoff>,
    /// The image pull back-off in force, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_backoff: Option<Backoff>,
}

/// A back-off delay and when it ends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Backoff {
    /// The current delay in seconds (10 s doubling up to 5 min).
    pub delay_seconds: u64,
    /// When it ends (the next try).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
}

/// One probe's current result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ProbeState {
    /// `liveness`, `readiness`, `startup`.
    pub kind: String,
    /// `Success`, `Failure` or `Unknown` (not decided yet).
    pub result: String,
}

/// `GET /v1/pods/<ns>/<name>`: what the node role holds for a pod.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct PodState {
    /// The pod's UID.
    pub uid: String,
    /// The pod worker's phase (`Syncing`, `Terminating`, `Terminated`,
    /// `Finished`); `None` when no worker runs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_phase: Option<String>,
    /// Refused by admission (never ran).
    pub rejected: bool,
    /// When its last sync ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync: Option<String>,
    /// When its worker syncs again at the latest (a back-off's end, a retry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_sync: Option<String>,
    /// Its containers.
    pub containers: Vec<ContainerState>,
    /// The status the node generated last (may be newer than the API's
    /// copy while the API server is unreachable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<k8s_openapi::api::core::v1::PodStatus>,
    /// The pod as the node has it (its spec, when the API server cannot be
    /// asked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<k8s_openapi::api::core::v1::Pod>,
}

/// `GET /v1/services/<ns>/<name>`: what the proxy role programmed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ServiceState {
    /// Whether the proxy role runs in this daemon.
    pub proxy_role: bool,
    /// `nftables` or `ebpf`.
    pub mode: String,
    /// Changes of this Service wait for a sync.
    pub pending: bool,
    /// Each programmed service port.
    pub ports: Vec<ProgrammedPort>,
    /// kube-proxy's `/healthz` answer: status code.
    pub healthz_code: u16,
    /// kube-proxy's `/healthz` body (`lastUpdated`, `currentTime`, ...).
    pub healthz_body: String,
}

/// One service port as the data plane was last told.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ProgrammedPort {
    /// `ns/name:port/PROTO`.
    pub name: String,
    /// `IPv4` / `IPv6`.
    pub family: String,
    /// Endpoints for Cluster traffic policy (`ip:port`).
    pub cluster_endpoints: Vec<String>,
    /// Endpoints for Local traffic policy.
    pub local_endpoints: Vec<String>,
}

/// Where a timeline record comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RecordSource {
    /// An Event keelson recorded (as kubelet or kube-proxy).
    Event,
    /// A write keelson sent to the API server, with its outcome.
    ApiWrite,
    /// An Event read from the API server (any component).
    ClusterEvent,
}

/// One entry of the timeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TimelineRecord {
    /// When (RFC 3339).
    pub time: String,
    /// Where it comes from.
    pub source: RecordSource,
    /// The object's kind (`Pod`, `Node`, `Service`, `Lease`, ...).
    pub kind: String,
    /// Its namespace (empty for cluster-scoped objects).
    #[serde(default)]
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its UID, when known.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    /// `spec.containers{app}` and the like.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub field_path: String,
    /// `Normal` / `Warning` for events; `ok` / `failed` for API writes.
    #[serde(rename = "type")]
    pub type_: String,
    /// Event reason, or the HTTP method of a write.
    pub reason: String,
    /// Event message, or what was written and how it ended.
    pub message: String,
    /// How many times an identical event was seen (events from the API).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<i32>,
}

/// An error body of the socket (404 for an unknown pod, ...).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: String,
}
