//! The CSIDriver objects, as kubelet v1.36's CSI plugin reads them (a
//! shared informer over `storage.k8s.io/v1` CSIDrivers, which the Node
//! authorizer lets a node list and watch): one reflector, asked by name.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::storage::v1::CSIDriver;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use tokio_util::sync::CancellationToken;

/// How long a lookup waits for the first list (kubelet's plugin waits for
/// its informer's sync before the volume manager starts).
const SYNC_WAIT: Duration = Duration::from_secs(10);

/// The CSIDriver lister.
#[derive(Clone)]
pub(crate) struct CsiDriverLister {
    store: Store<CSIDriver>,
}

impl std::fmt::Debug for CsiDriverLister {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CsiDriverLister").finish_non_exhaustive()
    }
}

impl CsiDriverLister {
    /// Starts watching CSIDrivers until `stop`.
    pub(crate) fn start(client: kube::Client, stop: CancellationToken) -> CsiDriverLister {
        let (store, writer) = reflector::store::<CSIDriver>();
        let api: Api<CSIDriver> = Api::all(client);
        tokio::spawn(async move {
            let mut stream = reflector::reflector(
                writer,
                watcher::watcher(api, watcher::Config::default()).default_backoff(),
            )
            .boxed();
            loop {
                let item = tokio::select! {
                    _ = stop.cancelled() => return,
                    item = stream.next() => item,
                };
                match item {
                    None => return,
                    Some(Ok(Event::InitDone)) => tracing::debug!("CSIDrivers listed"),
                    Some(Ok(_)) => {}
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "watching CSIDrivers failed; retrying")
                    }
                }
            }
        });
        CsiDriverLister { store }
    }

    /// The CSIDriver `name`; `Ok(None)` when there is none, `Err` when the
    /// CSIDrivers could not be listed yet.
    pub(crate) async fn get(&self, name: &str) -> Result<Option<Arc<CSIDriver>>, String> {
        if tokio::time::timeout(SYNC_WAIT, self.store.wait_until_ready())
            .await
            .is_err()
        {
            return Err(
                "failed to sync CSIDriver cache: timed out waiting for the condition".to_string(),
            );
        }
        Ok(self.store.get(&ObjectRef::new(name)))
    }
}
