//! The pod lifecycle started from what the node role shares
//! ([`NodeServices`]): the node's API client and CRI client, the event
//! recorder, the volume manager for volumes and ConfigMap/Secret lookups,
//! the status manager's allocatable resources, the runtime's network
//! readiness; the PLEG's health joins the node's Ready condition.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

use super::{PodsDeps, PodsError, PodsHandle, start};
use crate::NodeServices;
use crate::cgroups::CgroupFs;
use crate::volumes::VolumeManager;

/// Starts the pod lifecycle of the node role (`cgroups`: `None` for the
/// host's cgroup filesystem; `systemd_bus`: `None` for the system bus).
pub async fn start_for_node(
    services: &NodeServices,
    volumes: VolumeManager,
    cgroups: Option<Arc<dyn CgroupFs>>,
    systemd_bus: Option<String>,
) -> Result<PodsHandle, PodsError> {
    let ctx = &services.ctx;
    let cfg = (*ctx.config).clone();
    let node_ips = match crate::node_ip::resolve(cfg.node_ip) {
        Ok(ip) => vec![ip],
        Err(e) => {
            tracing::warn!(error = %e, "no node IP; pods get no hostIP");
            Vec::new()
        }
    };
    let status = services.status.clone();
    let allocatable = Arc::new(move || -> BTreeMap<String, ApiQuantity> {
        status
            .allocatable()
            .into_iter()
            .map(|(k, q)| (k, ApiQuantity(q.to_string())))
            .collect()
    });
    let runtime = services.runtime.clone();
    let network = Arc::new(move || runtime.network_errors());
    let volumes = Arc::new(volumes);
    let handle = start(
        PodsDeps {
            client: ctx.client.clone(),
            cri: services.cri.clone(),
            node_name: ctx.node_name.clone(),
            config: cfg,
            registry: ctx.registry.clone(),
            recorder: Some(services.recorder.clone()),
            volumes: volumes.clone(),
            env: volumes,
            allocatable,
            cgroups,
            systemd_bus,
            clock: None,
            node_ips,
            network: Some(network),
            services: None,
            probes: true,
            // `User-Agent: kube-probe/<major.minor>` of the version keelson reports.
            probe_config: keelson_probes::ProbeManagerConfig {
                kube_version: keelson_common::version::KUBERNETES_MINOR.to_string(),
                ..Default::default()
            },
            admit: Some({
                let eviction = services.eviction.clone();
                Arc::new(move |pod: &k8s_openapi::api::core::v1::Pod| eviction.admit(pod))
            }),
            shutdown_admit: Some({
                let flag = services.shutting_down.clone();
                Arc::new(move |_: &k8s_openapi::api::core::v1::Pod| {
                    super::admission::shutdown::admit(&flag)
                })
            }),
            node: None,
            devices: Some(services.devices.clone()),
        },
        ctx.shutdown.clone(),
    )
    .await?;
    let pleg = handle.pleg_health();
    services
        .runtime
        .add_health_check("PLEG", move || pleg.check());
    Ok(handle)
}
