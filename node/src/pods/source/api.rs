//! The API pod source: a list-then-watch of the Pods bound to this node
//! (`spec.nodeName=<node>`), relisting on 410 Gone and retrying with
//! backoff while the API server is away (pods keep running meanwhile).

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::SourceEvent;
use crate::pods::store::PodStore;

/// Watches this node's pods into `store`, reporting each change on `tx`,
/// once `node_synced` resolves (kubelet's `NewSourceApiserver` waits for
/// its Node informer so that admission sees the Node).
pub async fn run(
    client: kube::Client,
    node_name: String,
    store: PodStore,
    tx: mpsc::UnboundedSender<SourceEvent>,
    stop: CancellationToken,
    node_synced: impl std::future::Future<Output = ()>,
) {
    tokio::select! {
        _ = stop.cancelled() => return,
        _ = node_synced => {}
    }
    let api: Api<Pod> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node_name}"));
    let mut stream = watcher::watcher(api, config).default_backoff().boxed();
    let mut listing: Vec<Pod> = Vec::new();
    loop {
        let item = tokio::select! {
            _ = stop.cancelled() => return,
            item = stream.next() => item,
        };
        let Some(item) = item else { return };
        match item {
            Ok(Event::Init) => listing.clear(),
            Ok(Event::InitApply(p)) => listing.push(p),
            Ok(Event::InitDone) => {
                let mut pods = std::mem::take(&mut listing);
                // kubelet admits a batch oldest first (`PodsByCreationTime`).
                pods.sort_by(|a, b| {
                    let t = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
                    t(a).cmp(&t(b))
                });
                let removed = store.replace_api_pods(pods.clone());
                for p in removed {
                    let _ = tx.send(SourceEvent::Remove((*p).clone()));
                }
                for p in pods {
                    let _ = tx.send(SourceEvent::Upsert(p));
                }
                let _ = tx.send(SourceEvent::ApiSynced);
            }
            Ok(Event::Apply(p)) => {
                store.upsert(p.clone());
                let _ = tx.send(SourceEvent::Upsert(p));
            }
            Ok(Event::Delete(p)) => {
                store.remove(&p);
                let _ = tx.send(SourceEvent::Remove(p));
            }
            Err(e) => {
                tracing::warn!(error = %e, "watching this node's pods failed; retrying (running pods are kept)");
            }
        }
    }
}
