//! kubelet's RuntimeClass manager (`pkg/kubelet/runtimeclass`): a watch of
//! every RuntimeClass (the node may list them), and `LookupRuntimeHandler`:
//! no class or `""` → the runtime's default handler; a class that does not
//! exist → an error with the lister's NotFound text
//! (`runtimeclass.node.k8s.io "<name>" not found`), which the sandbox
//! creation reports as `FailedCreatePodSandBox`.

use futures::StreamExt;
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio_util::sync::CancellationToken;

/// `runtimeClassName` names a RuntimeClass that does not exist (the
/// lister's NotFound text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("runtimeclass.node.k8s.io {0:?} not found")]
pub struct RuntimeClassNotFound(pub String);

/// Resolves `runtimeClassName` to a CRI runtime handler.
pub trait RuntimeClasses: Send + Sync {
    /// `LookupRuntimeHandler`.
    fn lookup_handler(&self, name: Option<&str>) -> Result<String, RuntimeClassNotFound>;
}

/// The handler of a RuntimeClass found (or not) in a cache.
pub fn handler_of(
    name: Option<&str>,
    class: Option<&RuntimeClass>,
) -> Result<String, RuntimeClassNotFound> {
    match name.filter(|n| !n.is_empty()) {
        None => Ok(String::new()),
        Some(n) => class
            .map(|c| c.handler.clone())
            .ok_or_else(|| RuntimeClassNotFound(n.to_string())),
    }
}

/// RuntimeClasses from a watch of the API.
#[derive(Clone)]
pub struct ApiRuntimeClasses {
    store: Store<RuntimeClass>,
}

impl std::fmt::Debug for ApiRuntimeClasses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiRuntimeClasses")
            .field("known", &self.store.state().len())
            .finish()
    }
}

impl ApiRuntimeClasses {
    /// Starts the watch; it stops with `stop`.
    pub fn start(client: kube::Client, stop: CancellationToken) -> Self {
        let (store, writer) = reflector::store();
        let api: Api<RuntimeClass> = Api::all(client);
        tokio::spawn(async move {
            let mut stream = watcher::watcher(api, watcher::Config::default())
                .default_backoff()
                .reflect(writer)
                .boxed();
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    item = stream.next() => match item {
                        None => return,
                        Some(Err(e)) => tracing::debug!(error = %e, "watching RuntimeClasses failed; retrying"),
                        Some(Ok(_)) => {}
                    },
                }
            }
        });
        ApiRuntimeClasses { store }
    }
}

impl RuntimeClasses for ApiRuntimeClasses {
    fn lookup_handler(&self, name: Option<&str>) -> Result<String, RuntimeClassNotFound> {
        let class = name
            .filter(|n| !n.is_empty())
            .and_then(|n| self.store.get(&ObjectRef::new(n)));
        handler_of(name, class.as_deref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup() {
        let rc: RuntimeClass = serde_json::from_value(
            serde_json::json!({"metadata": {"name": "gvisor"}, "handler": "runsc"}),
        )
        .expect("rc");
        assert_eq!(handler_of(None, None), Ok(String::new()));
        assert_eq!(handler_of(Some(""), None), Ok(String::new()));
        assert_eq!(handler_of(Some("gvisor"), Some(&rc)), Ok("runsc".into()));
        assert_eq!(
            handler_of(Some("kata"), None),
            Err(RuntimeClassNotFound("kata".into()))
        );
        assert_eq!(
            RuntimeClassNotFound("kata".into()).to_string(),
            "runtimeclass.node.k8s.io \"kata\" not found"
        );
    }
}
