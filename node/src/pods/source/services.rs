//! The Service lister behind service environment variables: a reflector
//! over every Service, "synced" once the first list completed (until then
//! containers of API pods are not started, as kubelet does).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use tokio_util::sync::CancellationToken;

use crate::pods::runtime::ServiceEnv;
use crate::pods::runtime::service_env::service_env_map;

/// Service variables from a live Service cache.
#[derive(Clone)]
pub struct ServiceLister {
    store: Store<Service>,
    synced: Arc<AtomicBool>,
}

impl std::fmt::Debug for ServiceLister {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceLister")
            .field("synced", &self.synced.load(Ordering::Relaxed))
            .finish()
    }
}

impl ServiceLister {
    /// Starts watching Services; the task ends with `stop`.
    pub fn start(client: kube::Client, stop: CancellationToken) -> Self {
        let (store, writer) = reflector::store::<Service>();
        let synced = Arc::new(AtomicBool::new(false));
        let flag = synced.clone();
        let api: Api<Service> = Api::all(client);
        tokio::spawn(async move {
            let stream = reflector::reflector(
                writer,
                watcher::watcher(api, watcher::Config::default()).default_backoff(),
            );
            let mut stream = stream.boxed();
            loop {
                let item = tokio::select! {
                    _ = stop.cancelled() => return,
                    item = stream.next() => item,
                };
                match item {
                    None => return,
                    Some(Ok(Event::InitDone)) => flag.store(true, Ordering::SeqCst),
                    Some(Ok(_)) => {}
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "watching Services failed; retrying")
                    }
                }
            }
        });
        ServiceLister { store, synced }
    }

    /// Whether Services were listed once.
    pub fn has_synced(&self) -> bool {
        self.synced.load(Ordering::SeqCst)
    }
}

impl ServiceEnv for ServiceLister {
    fn service_env(&self, namespace: &str, links: bool) -> Option<BTreeMap<String, String>> {
        if !self.has_synced() {
            return None;
        }
        let all = self.store.state();
        Some(service_env_map(
            all.iter().map(|s| s.as_ref()),
            namespace,
            links,
        ))
    }
}
