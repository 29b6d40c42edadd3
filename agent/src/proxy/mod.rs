//! The proxy role: kube-proxy's replacement. Watches Services,
//! EndpointSlices, its Node and ServiceCIDRs, and programs Service routing
//! through keelson-netplane's [`Proxier`] with the nftables backend (or the
//! eBPF socket LB plus nftables for north-south traffic).
//!
//! Start-up, like kube-proxy: read the Node (its IPs decide the families and
//! the `primary` NodePort addresses), open the data plane, serve
//! `healthzBindAddress` (`/healthz`, `/livez`), then sync once the initial
//! Service and EndpointSlice lists are in; the previous instance's rules stay
//! in place (and keep serving) until that first sync replaces them
//! atomically.

pub mod conntrack_sysctl;
pub mod events;
pub mod introspect;
pub mod objects;
pub mod settings;
pub mod watch;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use keelson_netplane::Backend;
use keelson_netplane::ebpf::{EbpfBackend, EbpfConfig as NetplaneEbpfConfig, check_support};
use keelson_netplane::nftables::{NftablesBackend, NftablesConfig};
use keelson_netplane::proxier::{
    ConntrackCleaner, Proxier, ProxierConfig, ServiceHealthServer, StdListen,
};
use kube::Api;

use crate::config::proxy::{ProxyConfig, ProxyMode};
use crate::events::EventRecorder;
use crate::observability::ProbeKind;
use crate::role::RoleContext;

use self::events::KubeEvents;
use self::settings::SettingError;

/// Why the proxy role stopped.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// A `proxy:` setting cannot be used.
    #[error(transparent)]
    Config(#[from] SettingError),
    /// The data plane could not be opened.
    #[error("opening the {mode} data plane: {message}")]
    DataPlane {
        /// `nftables` or `ebpf`.
        mode: &'static str,
        /// Why.
        message: String,
    },
    /// The metrics could not be registered.
    #[error("registering proxy metrics: {0}")]
    Metrics(prometheus::Error),
    /// `healthzBindAddress` could not be served.
    #[error("proxy.healthzBindAddress {address}: {error}")]
    Healthz {
        /// The address.
        address: String,
        /// Why (in the text, not a source: said once).
        error: std::io::Error,
    },
}

/// The registry's error stays in the text and is not a source, so a
/// printed chain says it once.
impl From<prometheus::Error> for ProxyError {
    fn from(e: prometheus::Error) -> Self {
        ProxyError::Metrics(e)
    }
}

pub(crate) fn nftables_config(
    cfg: &ProxyConfig,
    families: &[keelson_netplane::model::IpFamily],
    node_ips: &std::collections::BTreeMap<keelson_netplane::model::IpFamily, std::net::IpAddr>,
) -> Result<NftablesConfig, ProxyError> {
    let bit = u32::try_from(cfg.nftables.masquerade_bit)
        .ok()
        .filter(|b| *b <= 31)
        .ok_or_else(|| SettingError {
            field: "nftables.masqueradeBit",
            message: format!("{} is not in [0, 31]", cfg.nftables.masquerade_bit),
        })?;
    Ok(NftablesConfig {
        families: families.to_vec(),
        masquerade_bit: bit,
        masquerade_all: cfg.nftables.masquerade_all,
        local_traffic: settings::local_traffic(&cfg.cluster_cidr)?,
        node_ips: node_ips.clone(),
        ..NftablesConfig::default()
    })
}

/// The socket LB's settings from `proxy.ebpf` (where it attaches and pins;
/// also where `keelson diagnose` reads its maps).
pub(crate) fn ebpf_config(cfg: &ProxyConfig) -> NetplaneEbpfConfig {
    NetplaneEbpfConfig {
        cgroup_path: cfg.ebpf.cgroup_path.clone(),
        bpffs_path: cfg.ebpf.bpffs_path.clone(),
    }
}

fn open_backend(cfg: &ProxyConfig, nft: NftablesConfig) -> Result<Box<dyn Backend>, ProxyError> {
    let nftables = |nft| -> Result<Box<dyn Backend>, ProxyError> {
        NftablesBackend::new(nft)
            .map(|b| Box::new(b) as Box<dyn Backend>)
            .map_err(|e| ProxyError::DataPlane {
                mode: "nftables",
                message: e.to_string(),
            })
    };
    match cfg.mode {
        ProxyMode::Nftables => nftables(nft),
        ProxyMode::Ebpf => {
            let ebpf = ebpf_config(cfg);
            if let Err(e) = check_support(&ebpf) {
                if cfg.ebpf.fallback_to_nftables {
                    tracing::warn!(error = %e, "eBPF socket LB unsupported here; using the nftables data plane (proxy.ebpf.fallbackToNftables)");
                    return nftables(nft);
                }
                return Err(ProxyError::DataPlane {
                    mode: "ebpf",
                    message: e.to_string(),
                });
            }
            let north_south = nftables(nft)?;
            EbpfBackend::new(&ebpf, north_south)
                .map(|b| Box::new(b) as Box<dyn Backend>)
                .map_err(|e| ProxyError::DataPlane {
                    mode: "ebpf",
                    message: e.to_string(),
                })
        }
    }
}

/// Removes what the proxy role installs in the current network namespace,
/// as `kube-proxy --cleanup` does: keelson's nftables tables in both
/// families and the eBPF socket LB's pinned links and maps (whatever
/// `proxy.mode` says now, since an earlier run may have used the other
/// mode). Stop keelson first: a running proxy re-creates them, and pinned
/// links stay attached while it holds them. Safe to run when nothing is
/// installed.
pub fn cleanup(cfg: &ProxyConfig) -> Result<(), ProxyError> {
    use keelson_netplane::model::IpFamily;
    // Both families (and the service tables of earlier versions).
    let nft = NftablesConfig {
        families: vec![IpFamily::V4, IpFamily::V6],
        ..NftablesConfig::default()
    };
    let nft_err = |e: keelson_netplane::BackendError| ProxyError::DataPlane {
        mode: "nftables",
        message: format!("removing the tables: {e}"),
    };
    let mut backend = NftablesBackend::new(nft).map_err(nft_err)?;
    backend.cleanup().map_err(nft_err)?;
    keelson_netplane::ebpf::cleanup(&ebpf_config(cfg)).map_err(|e| ProxyError::DataPlane {
        mode: "ebpf",
        message: format!("removing the pinned programs and maps: {e}"),
    })
}

/// CPUs this process may run on (kube-proxy's `runtime.NumCPU`).
fn online_cpus() -> usize {
    use nix::sched::{CpuSet, sched_getaffinity};
    match sched_getaffinity(nix::unistd::Pid::from_raw(0)) {
        Ok(set) => (0..CpuSet::count())
            .filter(|i| set.is_set(*i).unwrap_or(false))
            .count()
            .max(1),
        Err(_) => std::thread::available_parallelism().map_or(1, usize::from),
    }
}

/// Reads the Node, retrying with backoff until it exists (kube-proxy waits
/// for it too). `None` on shutdown.
async fn wait_for_node(api: &Api<Node>, ctx: &RoleContext) -> Option<Node> {
    let mut delay = Duration::from_millis(500);
    loop {
        match api.get_opt(&ctx.node_name).await {
            Ok(Some(n)) => return Some(n),
            Ok(None) => tracing::info!(node = %ctx.node_name, "waiting for the Node object"),
            Err(e) => {
                tracing::warn!(error = %crate::error_chain::error_chain(&e), "reading the Node failed; retrying")
            }
        }
        tokio::select! {
            _ = ctx.shutdown.cancelled() => return None,
            _ = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(Duration::from_secs(10));
    }
}

/// Runs the proxy role until `ctx.shutdown` is cancelled.
pub async fn run(ctx: RoleContext) -> Result<(), ProxyError> {
    let cfg = ctx.config.proxy.clone();
    let synced = ctx.health.register_flag(
        "proxy-services-synced",
        ProbeKind::Readiness,
        Some("services not listed yet"),
    );
    let spec = settings::node_port_spec(&cfg.node_port_addresses)?;
    // Validate before touching anything.
    settings::local_traffic(&cfg.cluster_cidr)?;

    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let Some(node) = wait_for_node(&nodes, &ctx).await else {
        return Ok(());
    };
    let node_ips = settings::node_ips(&node);
    let families = settings::families(&node_ips);
    tracing::info!(node = %ctx.node_name, ?families, mode = ?cfg.mode,
        since_start_ms = crate::lifecycle::since_start_ms(), "starting the proxy role");

    let nft = nftables_config(&cfg, &families, &node_ips)?;
    let (mut proxier, handle) = Proxier::pending(
        ProxierConfig {
            node_name: ctx.node_name.clone(),
            families: families.clone(),
            min_sync_period: cfg.min_sync_period.into(),
            sync_period: cfg.sync_period.into(),
        },
        &ctx.registry,
    )?;
    // The watchers start first: the initial Service and EndpointSlice
    // lists (hundreds of milliseconds at 10,000 Services) load while the
    // data plane opens (eBPF: loading the programs and reading back the
    // pinned maps). The first sync waits for both.
    watch::apply_node(&node, &handle, &families, &spec);
    let shutdown = ctx.shutdown.clone();
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(watch::services(
        Api::<objects::ProxyService>::all(ctx.client.clone()),
        handle.clone(),
        shutdown.clone(),
    ));
    tasks.spawn(watch::endpoint_slices(
        Api::<objects::ProxyEndpointSlice>::all(ctx.client.clone()),
        handle.clone(),
        shutdown.clone(),
    ));
    tasks.spawn(watch::node(
        nodes,
        ctx.node_name.clone(),
        handle.clone(),
        families.clone(),
        spec.clone(),
        shutdown.clone(),
    ));
    tasks.spawn(watch::service_cidrs(
        Api::<ServiceCIDR>::all(ctx.client.clone()),
        handle.clone(),
        families.clone(),
        shutdown.clone(),
    ));
    // On this thread (the nftables socket is opened in the thread's
    // network namespace), letting the runtime move its other tasks away.
    let open = || open_backend(&cfg, nft);
    let backend = match tokio::runtime::Handle::current().runtime_flavor() {
        tokio::runtime::RuntimeFlavor::CurrentThread => open(),
        _ => tokio::task::block_in_place(open),
    }?;
    tracing::info!(
        mode = backend.name(),
        since_start_ms = crate::lifecycle::since_start_ms(),
        "data plane opened"
    );
    let mode = backend.name();
    proxier.set_backend(backend);
    ctx.introspection
        .set_proxy(Arc::new(introspect::ProxyIntrospector::new(
            handle.clone(),
            mode,
        )));
    // Health-check node ports listen where NodePorts do.
    let local = settings::local_addresses();
    let mut hc_addresses = Vec::new();
    for f in &families {
        if let keelson_netplane::model::NodePortAddresses::Ips(ips) =
            settings::node_port_addresses(&spec, *f, &node_ips, &local)
        {
            hc_addresses.extend(ips);
        } else {
            hc_addresses.clear();
            break;
        }
    }
    let health_checks =
        ServiceHealthServer::new(Box::new(StdListen), hc_addresses, handle.health());
    let recorder = EventRecorder::start(
        ctx.client.clone(),
        "kube-proxy",
        &ctx.node_name,
        &ctx.registry,
    )
    .with_timeline(ctx.introspection.timeline().clone());
    let failures = conntrack_sysctl::apply(
        &cfg.conntrack,
        online_cpus(),
        &conntrack_sysctl::SysctlPaths::default(),
    );
    if !failures.is_empty() {
        let message = failures
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ");
        tracing::warn!(%message, "conntrack settings not applied (proxy.conntrack); the kernel's values stay");
        recorder.event(
            &crate::events::node_ref(&ctx.node_name),
            crate::events::EventType::Warning,
            "ConntrackSettingsNotApplied",
            format!("proxy.conntrack: {message}"),
        );
    }
    let mut proxier = proxier
        .with_health_checks(health_checks)
        .with_events(Arc::new(KubeEvents::new(recorder, &ctx.node_name)));
    match ConntrackCleaner::open() {
        Ok(ct) => proxier = proxier.with_conntrack(ct),
        Err(e) => {
            tracing::warn!(error = %e, "no conntrack cleanup for UDP Services (ctnetlink unavailable)")
        }
    }

    let _healthz = if cfg.healthz_bind_address.is_empty() {
        None
    } else {
        let listener = tokio::net::TcpListener::bind(&cfg.healthz_bind_address)
            .await
            .map_err(|error| ProxyError::Healthz {
                address: cfg.healthz_bind_address.clone(),
                error,
            })?;
        Some(handle.health().serve(listener))
    };

    let readiness = handle.clone();
    tasks.spawn(async move {
        // Ready once the first full sync programmed the initial lists.
        let start = tokio::time::Instant::now();
        readiness.programmed().await;
        synced.set_ok();
        tracing::info!(after = ?start.elapsed(), since_start_ms = crate::lifecycle::since_start_ms(), "proxy rules programmed");
    });
    proxier.run(shutdown).await;
    tasks.abort_all();
    Ok(())
}
