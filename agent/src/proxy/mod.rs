//! The proxy role: kube-proxy's replacement. Watches Services and
//! EndpointSlices and programs Service routing (nftables or eBPF).
//!
//! (Foundation: the role connects to the API server and keeps retrying with
//! backoff when it is unreachable; the data plane is wired in by the
//! netplane work.)

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};

use crate::observability::ProbeKind;
use crate::role::RoleContext;

/// Why the proxy role stopped.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {}

/// Runs the proxy role until `ctx.shutdown` is cancelled.
pub async fn run(ctx: RoleContext) -> Result<(), ProxyError> {
    let synced = ctx.health.register_flag(
        "proxy-services-synced",
        ProbeKind::Readiness,
        Some("services not listed yet"),
    );
    let api: Api<Service> = Api::all(ctx.client.clone());
    let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
    futures::pin_mut!(stream);
    loop {
        tokio::select! {
            _ = ctx.shutdown.cancelled() => return Ok(()),
            item = stream.next() => match item {
                Some(Ok(Event::InitDone)) => {
                    synced.set_ok();
                    tracing::info!("services listed");
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    tracing::warn!(error = %crate::error_chain::error_chain(&e), "watching services failed; retrying with backoff");
                }
                None => return Ok(()),
            }
        }
    }
}
