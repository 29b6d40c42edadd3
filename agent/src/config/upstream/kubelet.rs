//! A KubeletConfiguration (`kubelet.config.k8s.io/v1beta1`, the file
//! kubelet reads with `--config`, e.g. kubeadm's `/var/lib/kubelet/config.yaml`)
//! applied to keelson's `node:` section.
//!
//! Every v1beta1 field is handled here, in the order of upstream's
//! `staging/src/k8s.io/kubelet/config/v1beta1/types.go`:
//! - fields keelson implements set the matching keelson field, after
//!   upstream's defaulting (`pkg/kubelet/apis/config/v1beta1/defaults.go`):
//!   zero values of non-pointer fields mean "default", a pointer field keeps
//!   an explicit zero; `nodeStatusReportFrequency` follows
//!   `nodeStatusUpdateFrequency`; `serializeImagePulls` is false when
//!   `maxParallelImagePulls` ≥ 2; `evictionHard` replaces the defaults unless
//!   `mergeDefaultEvictionSettings` (as `cmd/kubelet/app/server.go`'s
//!   `loadConfigFile`); relative paths are relative to the file's directory
//!   (`KubeletConfigurationPathRefs`);
//! - fields keelson does not implement are accepted when they hold
//!   upstream's default and refused otherwise, with the field's path;
//! - anything else is an unknown field.
//!
//! A field absent from the file keeps the value keelson already has, which
//! is upstream's default unless a KeelsonConfiguration set it.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::common::{apply_logging, check_type_meta};
use super::reader::{CONTENT_TYPES, Default, Object, Report};
use crate::config::duration::KubeDuration;
use crate::config::eviction::default_eviction_hard;
use crate::config::kubelet_api::AuthorizationMode;
use crate::config::node::TaintConfig;
use crate::config::{CgroupDriver, Config};

/// `apiVersion` of the files read here.
pub const API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
/// `kind` of the files read here.
pub const KIND: &str = "KubeletConfiguration";

/// Upstream's `DefaultVolumePluginDir`.
const DEFAULT_VOLUME_PLUGIN_DIR: &str = "/usr/libexec/kubernetes/kubelet-plugins/volume/exec/";

/// Applies a KubeletConfiguration document to `cfg`. `dir` is the file's
/// directory (relative paths are resolved against it).
pub fn apply(cfg: &mut Config, doc: Value, dir: &Path, report: &mut Report) {
    let mut o = Object::root(doc, report);
    check_type_meta(&mut o, API_VERSION, KIND, report);
    let n = &mut cfg.node;
    let abs = |p: String| -> PathBuf {
        let p = PathBuf::from(p);
        if p.is_absolute() { p } else { dir.join(p) }
    };

    node_api(&mut o, n, &abs, report);
    if let Some(p) = o.string("staticPodPath", report) {
        n.static_pod_path = Some(abs(p));
    }
    if let Some(p) = o.string("podLogsDir", report) {
        n.pod_logs_dir = abs(p);
    }
    set(&mut n.sync_frequency, o.duration("syncFrequency", report));
    set(
        &mut n.file_check_frequency,
        o.duration("fileCheckFrequency", report),
    );
    o.unimplemented(
        "httpCheckFrequency",
        Default::Duration(KubeDuration::from_secs(20)),
        "no static pods from a URL",
        report,
    );
    o.unimplemented(
        "staticPodURL",
        Default::Str(""),
        "no static pods from a URL",
        report,
    );
    o.unimplemented(
        "staticPodURLHeader",
        Default::Empty,
        "no static pods from a URL",
        report,
    );
    // v1beta1 leaves readOnlyPort unset, so 0 (disabled) is its default.
    if let Some(p) = o.get::<i32>("readOnlyPort", report) {
        n.read_only_port = p;
    }
    if let Some(b) = o.flag("serverTLSBootstrap", report) {
        n.server_tls_bootstrap = b;
    }
    if let Some(b) = o.flag("rotateCertificates", report) {
        n.rotate_certificates = b;
    } else {
        // v1beta1's zero value: kubelet rotates only when asked (kubeadm asks).
        n.rotate_certificates = false;
    }
    o.unimplemented(
        "registryPullQPS",
        Default::IntExact(5),
        "image pulls are not rate limited",
        report,
    );
    o.unimplemented(
        "registryBurst",
        Default::Int(10),
        "image pulls are not rate limited",
        report,
    );
    // Empty is v1beta1's unset: defaulting gives NeverVerifyPreloadedImages.
    if let Some(p) = o.string("imagePullCredentialsVerificationPolicy", report)
        && !p.is_empty()
    {
        n.image_pull_credentials_verification_policy = p;
    }
    if let Some(list) = o.get::<Vec<String>>("preloadedImagesVerificationAllowlist", report) {
        n.preloaded_images_verification_allowlist = list;
    }
    o.unimplemented(
        "eventRecordQPS",
        Default::IntExact(50),
        "events use keelson's own rate limit",
        report,
    );
    o.unimplemented(
        "eventBurst",
        Default::Int(100),
        "events use keelson's own rate limit",
        report,
    );
    o.unimplemented(
        "enableContentionProfiling",
        Default::Bool(false),
        "no profiling",
        report,
    );
    healthz(cfg_healthz(&mut o, report), &mut cfg.healthz_bind_address);
    let n = &mut cfg.node;
    if let Some(v) = o.get::<i32>("oomScoreAdj", report) {
        n.oom_score_adj = v;
    }
    if let Some(d) = o.string("clusterDomain", report) {
        n.cluster_domain = d;
    }
    if let Some(list) = o.get::<Vec<String>>("clusterDNS", report) {
        let mut ips = Vec::new();
        for (i, s) in list.iter().enumerate() {
            match s.parse::<IpAddr>() {
                Ok(ip) => ips.push(ip),
                Err(_) => report.error(
                    format!("clusterDNS[{i}]"),
                    format!("{s:?} is not an IP address"),
                ),
            }
        }
        n.cluster_dns = ips;
    }
    let update = o.duration("nodeStatusUpdateFrequency", report);
    let report_freq = o.duration("nodeStatusReportFrequency", report);
    match (update, report_freq) {
        (_, Some(r)) => n.node_status_report_frequency = r,
        // Upstream: set explicitly, the update frequency is also the report frequency.
        (Some(u), None) => n.node_status_report_frequency = u,
        (None, None) => {}
    }
    set(&mut n.node_status_update_frequency, update);
    if let Some(v) = o.int("nodeLeaseDurationSeconds", report) {
        n.node_lease_duration_seconds = clamp_i32(v);
    }
    set(
        &mut n.image_minimum_gc_age,
        o.duration("imageMinimumGCAge", report),
    );
    if let Some(d) = o.duration_ptr("imageMaximumGCAge", report) {
        n.image_maximum_gc_age = d;
    }
    if let Some(v) = o.get::<i32>("imageGCHighThresholdPercent", report) {
        n.image_gc_high_threshold_percent = v;
    }
    if let Some(v) = o.get::<i32>("imageGCLowThresholdPercent", report) {
        n.image_gc_low_threshold_percent = v;
    }
    // v1beta1 defaulting: zero is one minute.
    set(
        &mut n.volume_stats_agg_period,
        o.duration("volumeStatsAggPeriod", report),
    );
    o.unimplemented(
        "kubeletCgroups",
        Default::Str(""),
        "keelson stays in its own cgroup",
        report,
    );
    o.unimplemented(
        "systemCgroups",
        Default::Str(""),
        "system cgroups are not managed",
        report,
    );
    if let Some(r) = o.string("cgroupRoot", report) {
        n.cgroup_root = r;
    }
    if let Some(b) = o.get::<bool>("cgroupsPerQOS", report) {
        n.cgroups_per_qos = b;
    }
    match o.string("cgroupDriver", report).as_deref() {
        None => {}
        Some("cgroupfs") => n.cgroup_driver = CgroupDriver::Cgroupfs,
        Some("systemd") => n.cgroup_driver = CgroupDriver::Systemd,
        Some(other) => report.error(
            "cgroupDriver",
            format!("must be \"cgroupfs\" or \"systemd\", got {other:?}"),
        ),
    }
    o.unimplemented(
        "cpuManagerPolicy",
        Default::Str("none"),
        "no CPU manager",
        report,
    );
    if let Some(b) = o.get::<bool>("singleProcessOOMKill", report) {
        n.single_process_oom_kill = Some(b);
    }
    o.unimplemented(
        "cpuManagerPolicyOptions",
        Default::Empty,
        "no CPU manager",
        report,
    );
    o.unimplemented(
        "cpuManagerReconcilePeriod",
        Default::Duration(KubeDuration::from_secs(10)),
        "no CPU manager",
        report,
    );
    o.unimplemented(
        "memoryManagerPolicy",
        Default::Str("None"),
        "no memory manager",
        report,
    );
    o.unimplemented(
        "topologyManagerPolicy",
        Default::Str("none"),
        "no topology manager",
        report,
    );
    o.unimplemented(
        "topologyManagerScope",
        Default::Str("container"),
        "no topology manager",
        report,
    );
    o.unimplemented(
        "topologyManagerPolicyOptions",
        Default::Empty,
        "no topology manager",
        report,
    );
    o.unimplemented(
        "qosReserved",
        Default::Empty,
        "no QoS memory reservation",
        report,
    );
    set(
        &mut n.runtime_request_timeout,
        o.duration("runtimeRequestTimeout", report),
    );
    o.unimplemented(
        "hairpinMode",
        Default::Str("promiscuous-bridge"),
        "hairpin traffic is the CNI plugin's business",
        report,
    );
    if let Some(v) = o.int("maxPods", report) {
        n.max_pods = clamp_i32(v);
    }
    if let Some(c) = o.string("podCIDR", report) {
        n.pod_cidr = c;
    }
    if let Some(v) = o.get::<i64>("podPidsLimit", report) {
        // Upstream: nil or negative means -1.
        n.pod_pids_limit = if v < 0 { -1 } else { v };
    }
    if let Some(r) = o.get::<String>("resolvConf", report) {
        // An explicit "" disables the host's resolver for pods, as kubelet.
        n.resolv_conf = if r.is_empty() { PathBuf::new() } else { abs(r) };
    }
    o.unimplemented(
        "runOnce",
        Default::Bool(false),
        "runOnce mode is deprecated upstream",
        report,
    );
    if let Some(b) = o.get::<bool>("cpuCFSQuota", report) {
        n.cpu_cfs_quota = b;
    }
    if let Some(d) = o.duration_ptr("cpuCFSQuotaPeriod", report) {
        n.cpu_cfs_quota_period = d;
    }
    if let Some(v) = o.get::<i32>("nodeStatusMaxImages", report) {
        n.node_status_max_images = v;
    }
    o.unimplemented(
        "maxOpenFiles",
        Default::Int(1_000_000),
        "the systemd unit sets LimitNOFILE",
        report,
    );
    o.unimplemented(
        "contentType",
        CONTENT_TYPES,
        "keelson always speaks JSON",
        report,
    );
    if let Some(q) = o.get::<i32>("kubeAPIQPS", report) {
        // client-go reads 0 as its default of 5.
        n.kube_api_qps = if q == 0 { 5.0 } else { q as f32 };
    }
    if let Some(b) = o.int("kubeAPIBurst", report) {
        n.kube_api_burst = clamp_i32(b);
    }
    let serialize = o.get::<bool>("serializeImagePulls", report);
    let parallel = o.get::<i32>("maxParallelImagePulls", report);
    n.max_parallel_image_pulls = parallel.or(n.max_parallel_image_pulls);
    n.serialize_image_pulls = match (serialize, parallel) {
        (Some(s), _) => s,
        (None, Some(p)) => p < 2,
        (None, None) => n.serialize_image_pulls,
    };
    apply_eviction(n, &mut o, report);
    o.unimplemented(
        "podsPerCore",
        Default::IntExact(0),
        "maxPods is the only pod limit",
        report,
    );
    o.unimplemented(
        "enableControllerAttachDetach",
        Default::Bool(true),
        "volumes are attached by the attach/detach controller",
        report,
    );
    o.unimplemented(
        "protectKernelDefaults",
        Default::Bool(false),
        "kernel tunables are not checked",
        report,
    );
    o.unimplemented(
        "makeIPTablesUtilChains",
        Default::Bool(true),
        "keelson creates no iptables chains",
        report,
    );
    o.unimplemented(
        "iptablesMasqueradeBit",
        Default::IntExact(14),
        "keelson creates no iptables chains",
        report,
    );
    o.unimplemented(
        "iptablesDropBit",
        Default::IntExact(15),
        "keelson creates no iptables chains",
        report,
    );
    o.unimplemented(
        "featureGates",
        Default::Empty,
        "keelson has no feature gates",
        report,
    );
    if let Some(b) = o.get::<bool>("failSwapOn", report) {
        n.fail_swap_on = b;
    }
    let mut swap = o.object("memorySwap", report);
    swap.unimplemented(
        "swapBehavior",
        Default::OneOf(&["NoSwap", ""]),
        "containers get no swap",
        report,
    );
    swap.finish(report);
    // Container log rotation (pkg/kubelet/logs/container_log_manager.go,
    // keelson's `node.containerLog*`). v1beta1 defaulting (defaults.go):
    // an empty size is 10Mi; the other three are pointers, so an explicit
    // value, 0 included, is kept and validated (validation.go).
    if let Some(size) = o.string("containerLogMaxSize", report) {
        n.container_log_max_size = size;
    }
    if let Some(v) = o.get::<i32>("containerLogMaxFiles", report) {
        n.container_log_max_files = v;
    }
    if let Some(v) = o.get::<i32>("containerLogMaxWorkers", report) {
        n.container_log_max_workers = v;
    }
    if let Some(d) = o.duration_ptr("containerLogMonitorInterval", report) {
        n.container_log_monitor_interval = d;
    }
    o.unimplemented(
        "configMapAndSecretChangeDetectionStrategy",
        Default::Str("Watch"),
        "keelson watches the ConfigMaps and Secrets pods use",
        report,
    );
    if let Some(m) = o.get::<BTreeMap<String, String>>("systemReserved", report) {
        n.system_reserved = m;
    }
    if let Some(m) = o.get::<BTreeMap<String, String>>("kubeReserved", report) {
        n.kube_reserved = m;
    }
    o.unimplemented(
        "reservedSystemCPUs",
        Default::Str(""),
        "no CPU manager",
        report,
    );
    o.unimplemented(
        "showHiddenMetricsForVersion",
        Default::Str(""),
        "no hidden metrics",
        report,
    );
    o.unimplemented(
        "systemReservedCgroup",
        Default::Str(""),
        "only the pods cgroup is enforced",
        report,
    );
    o.unimplemented(
        "kubeReservedCgroup",
        Default::Str(""),
        "only the pods cgroup is enforced",
        report,
    );
    o.unimplemented(
        "enforceNodeAllocatable",
        Default::List(&["pods"]),
        "only the pods cgroup is enforced",
        report,
    );
    if let Some(list) = o.get::<Vec<String>>("allowedUnsafeSysctls", report) {
        n.allowed_unsafe_sysctls = list;
    }
    o.unimplemented(
        "volumePluginDir",
        Default::Str(DEFAULT_VOLUME_PLUGIN_DIR),
        "no FlexVolume plugins",
        report,
    );
    if let Some(p) = o.string("providerID", report) {
        n.provider_id = p;
    }
    if let Some(b) = o.flag("kernelMemcgNotification", report) {
        n.kernel_memcg_notification = b;
    }
    apply_logging(cfg, &mut o, report);
    let n = &mut cfg.node;
    o.unimplemented(
        "enableSystemLogQuery",
        Default::Bool(false),
        "no node log query",
        report,
    );
    if let Some(d) = o.duration("shutdownGracePeriod", report) {
        n.shutdown_grace_period = d;
    }
    if let Some(d) = o.duration("shutdownGracePeriodCriticalPods", report) {
        n.shutdown_grace_period_critical_pods = d;
    }
    if let Some(list) = o.get("shutdownGracePeriodByPodPriority", report) {
        n.shutdown_grace_period_by_pod_priority = list;
    }
    let mut crash = o.object("crashLoopBackOff", report);
    crash.unimplemented(
        "maxContainerRestartPeriod",
        Default::Duration(KubeDuration::from_secs(300)),
        "the CrashLoopBackOff cap is kubelet's 5 minutes",
        report,
    );
    crash.finish(report);
    o.unimplemented(
        "reservedMemory",
        Default::Empty,
        "no memory manager",
        report,
    );
    o.unimplemented(
        "seccompDefault",
        Default::Bool(false),
        "RuntimeDefault seccomp is not the default",
        report,
    );
    o.unimplemented(
        "memoryThrottlingFactor",
        Default::Float(0.9),
        "no memory QoS",
        report,
    );
    o.unimplemented(
        "memoryReservationPolicy",
        Default::Str("None"),
        "no memory QoS",
        report,
    );
    if let Some(items) = o.get::<Vec<TaintConfig>>("registerWithTaints", report) {
        n.register_with_taints = items.into_iter().map(Into::into).collect();
    }
    if let Some(b) = o.get::<bool>("registerNode", report) {
        n.register_node = b;
    }
    o.unimplemented("tracing", Default::Empty, "no tracing", report);
    o.unimplemented(
        "localStorageCapacityIsolation",
        Default::Bool(true),
        "local ephemeral storage is always accounted",
        report,
    );
    if let Some(e) = o.string("containerRuntimeEndpoint", report) {
        n.container_runtime_endpoint = e;
    }
    if let Some(e) = o.string("imageServiceEndpoint", report) {
        n.image_service_endpoint = Some(e);
    }
    // v1beta1 defaults failCgroupV1 to true: kubelet refuses cgroup v1 hosts.
    n.fail_cgroup_v1 = o.get::<bool>("failCgroupV1", report).unwrap_or(true);
    let mut userns = o.object("userNamespaces", report);
    userns.unimplemented(
        "idsPerPod",
        Default::IntExact(65536),
        "no user namespaces",
        report,
    );
    userns.finish(report);
    o.finish(report);
}

/// `healthzBindAddress` + `healthzPort`, as kubelet serves them:
/// `None` when neither is in the file, `Some(None)` when the port is 0
/// (healthz disabled), else the address.
fn cfg_healthz(o: &mut Object, report: &mut Report) -> Option<Option<String>> {
    let addr = o.string("healthzBindAddress", report);
    let port = o.get::<i32>("healthzPort", report);
    if addr.is_none() && port.is_none() {
        return None;
    }
    let port = port.unwrap_or(10248);
    if port == 0 {
        return Some(None);
    }
    if !(1..=65535).contains(&port) {
        report.error(
            "healthzPort",
            format!("{port} must be between 1 and 65535, inclusive"),
        );
        return None;
    }
    let addr = addr.unwrap_or_else(|| "127.0.0.1".to_string());
    let Ok(ip) = addr.parse::<IpAddr>() else {
        report.error(
            "healthzBindAddress",
            format!("{addr:?} is not an IP address"),
        );
        return None;
    };
    Some(Some(std::net::SocketAddr::new(ip, port as u16).to_string()))
}

fn healthz(v: Option<Option<String>>, target: &mut Option<String>) {
    match v {
        None => {}
        // An empty address disables keelson's healthz server.
        Some(None) => *target = Some(String::new()),
        Some(Some(a)) => *target = Some(a),
    }
}

fn apply_eviction(n: &mut crate::config::NodeConfig, o: &mut Object, report: &mut Report) {
    let hard = o.get::<BTreeMap<String, String>>("evictionHard", report);
    if let Some(m) = o.get::<BTreeMap<String, String>>("evictionSoft", report) {
        n.eviction_soft = m;
    }
    if let Some(m) = o.get::<BTreeMap<String, String>>("evictionSoftGracePeriod", report) {
        let mut out = BTreeMap::new();
        for (k, v) in m {
            match KubeDuration::parse(&v) {
                Ok(d) => {
                    out.insert(k, d);
                }
                Err(e) => report.error(format!("evictionSoftGracePeriod[{k:?}]"), e.to_string()),
            }
        }
        n.eviction_soft_grace_period = out;
    }
    set(
        &mut n.eviction_pressure_transition_period,
        o.duration("evictionPressureTransitionPeriod", report),
    );
    if let Some(v) = o.int("evictionMaxPodGracePeriod", report) {
        n.eviction_max_pod_grace_period = clamp_i32(v);
    }
    if let Some(m) = o.get::<BTreeMap<String, String>>("evictionMinimumReclaim", report) {
        n.eviction_minimum_reclaim = m;
    }
    let merge = o
        .get::<bool>("mergeDefaultEvictionSettings", report)
        .unwrap_or(false);
    if let Some(mut hard) = hard {
        if merge {
            for (k, v) in default_eviction_hard() {
                hard.entry(k).or_insert(v);
            }
        }
        n.eviction_hard = hard;
    }
}

/// The node API (kubelet's HTTPS server on `:10250`): `address`, `port`,
/// TLS, `authentication`, `authorization` and the handlers, with v1beta1's
/// defaulting (`pkg/kubelet/apis/config/v1beta1/defaults.go`): zero
/// durations and empty strings mean the default; the `*bool`s
/// `authentication.webhook.enabled`, `authentication.anonymous.enabled` and
/// `enableDebuggingHandlers` keep an explicit `false`.
fn node_api(
    o: &mut Object,
    n: &mut crate::config::node::NodeConfig,
    abs: &dyn Fn(String) -> PathBuf,
    report: &mut Report,
) {
    o.unimplemented(
        "enableServer",
        Default::Bool(true),
        "the node API is always served",
        report,
    );
    if let Some(a) = o.string("address", report) {
        n.address = a;
    }
    if let Some(p) = o.int("port", report) {
        n.port = clamp_i32(p);
    }
    if let Some(p) = o.string("tlsCertFile", report) {
        n.tls_cert_file = Some(abs(p));
    }
    if let Some(p) = o.string("tlsPrivateKeyFile", report) {
        n.tls_private_key_file = Some(abs(p));
    }
    if let Some(list) = o.get::<Vec<String>>("tlsCipherSuites", report) {
        n.tls_cipher_suites = list;
    }
    o.unimplemented(
        "tlsCurvePreferences",
        Default::Empty,
        "the TLS library's key exchange groups are used",
        report,
    );
    if let Some(v) = o.string("tlsMinVersion", report) {
        n.tls_min_version = v;
    }

    let mut authn = o.object("authentication", report);
    let mut x509 = authn.object("x509", report);
    if let Some(p) = x509.string("clientCAFile", report) {
        n.authentication.x509.client_ca_file = Some(abs(p));
    }
    x509.finish(report);
    let mut webhook = authn.object("webhook", report);
    if let Some(b) = webhook.flag("enabled", report) {
        n.authentication.webhook.enabled = b;
    }
    set(
        &mut n.authentication.webhook.cache_ttl,
        webhook.duration("cacheTTL", report),
    );
    webhook.finish(report);
    let mut anonymous = authn.object("anonymous", report);
    if let Some(b) = anonymous.flag("enabled", report) {
        n.authentication.anonymous.enabled = b;
    }
    anonymous.finish(report);
    authn.finish(report);

    let mut authz = o.object("authorization", report);
    if let Some(mode) = authz.string("mode", report) {
        match mode.as_str() {
            "Webhook" => n.authorization.mode = AuthorizationMode::Webhook,
            "AlwaysAllow" => n.authorization.mode = AuthorizationMode::AlwaysAllow,
            other => report.error(
                authz.path("mode"),
                format!("{other:?}: must be Webhook or AlwaysAllow"),
            ),
        }
    }
    let mut webhook = authz.object("webhook", report);
    set(
        &mut n.authorization.webhook.cache_authorized_ttl,
        webhook.duration("cacheAuthorizedTTL", report),
    );
    set(
        &mut n.authorization.webhook.cache_unauthorized_ttl,
        webhook.duration("cacheUnauthorizedTTL", report),
    );
    webhook.finish(report);
    authz.finish(report);

    if let Some(b) = o.flag("enableDebuggingHandlers", report) {
        n.enable_debugging_handlers = b;
    }
    set(
        &mut n.streaming_connection_idle_timeout,
        o.duration("streamingConnectionIdleTimeout", report),
    );
    // keelson serves no `/logs/`, `/debug/pprof` or `/debug/flags/v`:
    // `false` is honoured as it is; an explicit `true` (upstream's default)
    // is listed in the warning of fields keelson does not implement.
    for key in [
        "enableSystemLogHandler",
        "enableProfilingHandler",
        "enableDebugFlagsHandler",
    ] {
        if o.flag(key, report) == Some(true) {
            report.ignored.push(o.path(key));
        }
    }
}

fn set(target: &mut KubeDuration, v: Option<KubeDuration>) {
    if let Some(d) = v {
        *target = d;
    }
}

fn clamp_i32(v: i64) -> i32 {
    v.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32
}
