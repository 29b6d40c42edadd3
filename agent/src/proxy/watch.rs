//! List-watch of the objects the proxy role needs, feeding the proxier:
//! Services and EndpointSlices (without those another proxy owns and, for
//! slices, those of headless Services, like kube-proxy's informers), this
//! Node (zone, addresses, taints, deletion) and ServiceCIDRs.

use std::collections::BTreeMap;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use keelson_netplane::model::IpFamily;
use keelson_netplane::proxier::ProxyHandle;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};

/// The initial list as kube-proxy's informers ask it: `resourceVersion=0`
/// without a page limit, which kube-apiserver answers from its watch cache
/// in one response. (kube-rs's default pages of 500 drop the
/// `resourceVersion=0` and make a consistent, paginated list: with 10,000
/// Services and their slices that is 40 requests through the client's
/// qps/burst limit before the first sync.)
fn whole_list(mut cfg: watcher::Config) -> watcher::Config {
    cfg.page_size = None;
    cfg
}
use tokio_util::sync::CancellationToken;

use super::objects::{ProxyEndpointSlice, ProxyService};
use super::settings::{self, NodePortSpec};

/// kube-proxy's Service informer selector.
pub const SERVICE_SELECTOR: &str = "!service.kubernetes.io/service-proxy-name";
/// kube-proxy's EndpointSlice informer selector.
pub const SLICE_SELECTOR: &str =
    "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless";
/// The zone label.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// One change of a watched kind, as the proxier takes it.
enum Change<K> {
    /// The complete initial (or re-)list.
    Listed(Vec<K>),
    /// Added or modified.
    Applied(K),
    /// Deleted.
    Deleted(K),
}

/// Lists (whole, like kube-proxy's informers) and watches the objects of
/// `api` matching `selector` until shutdown, handing each change to `apply`;
/// failures are logged and retried with backoff.
async fn watch<K>(
    api: Api<K>,
    selector: &str,
    what: &'static str,
    shutdown: CancellationToken,
    mut apply: impl FnMut(Change<K>),
) where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    let cfg = whole_list(watcher::Config::default().labels(selector));
    let stream = watcher::watcher(api, cfg).default_backoff();
    futures::pin_mut!(stream);
    let mut init: Vec<K> = Vec::new();
    let mut listing = std::time::Instant::now();
    loop {
        let item = tokio::select! {
            _ = shutdown.cancelled() => return,
            item = stream.next() => item,
        };
        match item {
            None => return,
            Some(Err(e)) => {
                tracing::warn!(error = %crate::error_chain::error_chain(&e), "watching {what} failed; retrying")
            }
            Some(Ok(Event::Init)) => {
                init.clear();
                listing = std::time::Instant::now();
            }
            Some(Ok(Event::InitApply(o))) => init.push(o),
            Some(Ok(Event::InitDone)) => {
                let objects = init.len();
                let listed = listing.elapsed();
                apply(Change::Listed(std::mem::take(&mut init)));
                tracing::info!(
                    what,
                    objects,
                    list_ms = listed.as_millis() as u64,
                    apply_ms = (listing.elapsed() - listed).as_millis() as u64,
                    since_start_ms = crate::lifecycle::since_start_ms(),
                    "initial list handed to the proxier"
                );
            }
            Some(Ok(Event::Apply(o))) => apply(Change::Applied(o)),
            Some(Ok(Event::Delete(o))) => apply(Change::Deleted(o)),
        }
    }
}

/// Watches Services until shutdown.
pub async fn services(api: Api<ProxyService>, handle: ProxyHandle, shutdown: CancellationToken) {
    watch(api, SERVICE_SELECTOR, "Services", shutdown, |c| match c {
        Change::Listed(all) => {
            handle.replace_services(all.iter().map(ProxyService::to_api));
            handle.services_synced();
        }
        Change::Applied(s) => handle.update_service(&s.to_api()),
        Change::Deleted(s) => {
            let meta = kube::Resource::meta(&s);
            handle.delete_service(
                meta.namespace.as_deref().unwrap_or_default(),
                meta.name.as_deref().unwrap_or_default(),
            )
        }
    })
    .await;
}

/// Watches EndpointSlices until shutdown.
pub async fn endpoint_slices(
    api: Api<ProxyEndpointSlice>,
    handle: ProxyHandle,
    shutdown: CancellationToken,
) {
    watch(
        api,
        SLICE_SELECTOR,
        "EndpointSlices",
        shutdown,
        |c| match c {
            Change::Listed(all) => {
                handle.replace_endpoint_slices(all.iter().map(ProxyEndpointSlice::to_api));
                handle.endpoint_slices_synced();
            }
            Change::Applied(s) => handle.update_endpoint_slice(&s.to_api()),
            Change::Deleted(s) => handle.delete_endpoint_slice(&s.to_api()),
        },
    )
    .await;
}

/// Applies what the proxy uses of its Node.
pub fn apply_node(node: &Node, handle: &ProxyHandle, families: &[IpFamily], spec: &NodePortSpec) {
    let zone = node
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(ZONE_LABEL))
        .cloned();
    handle.set_node_zone(zone);
    let taints: Vec<String> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .map(|t| t.key.clone())
        .collect();
    handle.sync_node(node.metadata.deletion_timestamp.is_some(), &taints);
    let ips = settings::node_ips(node);
    let local = settings::local_addresses();
    for f in families {
        handle.set_node_port_addresses(*f, settings::node_port_addresses(spec, *f, &ips, &local));
    }
}

/// Watches this Node until shutdown.
pub async fn node(
    api: Api<Node>,
    name: String,
    handle: ProxyHandle,
    families: Vec<IpFamily>,
    spec: NodePortSpec,
    shutdown: CancellationToken,
) {
    let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let stream = watcher::watcher(api, cfg).default_backoff();
    futures::pin_mut!(stream);
    loop {
        let item = tokio::select! {
            _ = shutdown.cancelled() => return,
            item = stream.next() => item,
        };
        match item {
            None => return,
            Some(Err(e)) => {
                tracing::warn!(error = %crate::error_chain::error_chain(&e), "watching the Node failed; retrying")
            }
            Some(Ok(Event::Apply(n) | Event::InitApply(n))) => {
                apply_node(&n, &handle, &families, &spec)
            }
            Some(Ok(Event::Delete(_))) => handle.sync_node(true, &[]),
            Some(Ok(_)) => {}
        }
    }
}

/// Watches ServiceCIDRs (networking.k8s.io/v1) until shutdown; stops
/// quietly when the API server does not serve them.
pub async fn service_cidrs(
    api: Api<ServiceCIDR>,
    handle: ProxyHandle,
    families: Vec<IpFamily>,
    shutdown: CancellationToken,
) {
    if let Err(e) = api.list(&Default::default()).await {
        tracing::info!(error = %crate::error_chain::error_chain(&e), "ServiceCIDRs not available; traffic to unallocated ClusterIPs is not dropped");
        return;
    }
    let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
    futures::pin_mut!(stream);
    let mut all: BTreeMap<String, ServiceCIDR> = BTreeMap::new();
    let mut init: Vec<ServiceCIDR> = Vec::new();
    loop {
        let item = tokio::select! {
            _ = shutdown.cancelled() => return,
            item = stream.next() => item,
        };
        match item {
            None => return,
            Some(Err(e)) => {
                tracing::warn!(error = %crate::error_chain::error_chain(&e), "watching ServiceCIDRs failed; retrying");
                continue;
            }
            Some(Ok(Event::Init)) => {
                init.clear();
                continue;
            }
            Some(Ok(Event::InitApply(c))) => {
                init.push(c);
                continue;
            }
            Some(Ok(Event::InitDone)) => {
                all = std::mem::take(&mut init)
                    .into_iter()
                    .map(|c| (c.metadata.name.clone().unwrap_or_default(), c))
                    .collect();
            }
            Some(Ok(Event::Apply(c))) => {
                all.insert(c.metadata.name.clone().unwrap_or_default(), c);
            }
            Some(Ok(Event::Delete(c))) => {
                all.remove(c.metadata.name.as_deref().unwrap_or_default());
            }
        }
        let mut by_family: BTreeMap<IpFamily, Vec<ipnet::IpNet>> =
            families.iter().map(|f| (*f, Vec::new())).collect();
        for c in all.values() {
            for s in c
                .spec
                .as_ref()
                .and_then(|s| s.cidrs.as_ref())
                .into_iter()
                .flatten()
            {
                match s.parse::<ipnet::IpNet>() {
                    Ok(net) => {
                        if let Some(v) = by_family.get_mut(&IpFamily::of(&net.addr())) {
                            v.push(net);
                        }
                    }
                    Err(e) => {
                        tracing::warn!(cidr = %s, error = %e, "ignoring unparsable ServiceCIDR")
                    }
                }
            }
        }
        for (f, cidrs) in by_family {
            handle.set_service_cidrs(f, cidrs);
        }
    }
}
