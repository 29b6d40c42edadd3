//! Plugin registration through `<root>/plugins_registry`, as kubelet v1.36's
//! plugin manager does it (`pkg/kubelet/pluginmanager/`):
//!
//! - [`watcher`] (`pluginwatcher/plugin_watcher.go`): inotify on the
//!   directory and its subdirectories; a new socket (name not starting with
//!   `.`) is a plugin to register, a removed one a plugin to deregister. The
//!   directory is walked at start, so plugins that registered with a
//!   previous keelson register again after a restart.
//! - [`registry`] (`reconciler/reconciler.go`, `cache/`): every second,
//!   plugins whose socket is gone (or was re-created) are deregistered and
//!   new ones registered, one operation per socket at a time, a failed
//!   registration retried with exponential backoff (500 ms doubling to
//!   2 min 2 s, `goroutinemap/exponentialbackoff`).
//! - [`registration`] (`operationexecutor/operation_generator.go`): dial the
//!   socket (10 s), `GetInfo` (1 s), find the handler of the plugin's type,
//!   `ValidatePlugin`, `RegisterPlugin`, then `NotifyRegistrationStatus`
//!   (5 s) with the outcome.
//!
//! Handlers ([`PluginHandler`]) are added per plugin type
//! (`DevicePlugin`, `CSIPlugin`, `DRAPlugin`); a plugin of a type without
//! a handler is told so and not registered.

pub(crate) mod registration;
pub(crate) mod registry;
pub(crate) mod watcher;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

/// The directory's name under the root dir (`config.DefaultKubeletPluginsRegistrationDirName`).
pub const REGISTRY_DIR_NAME: &str = "plugins_registry";

/// A boxed future, for the handler's asynchronous registration.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What handles plugins of one type (`cache.PluginHandler`).
pub trait PluginHandler: Send + Sync {
    /// `ValidatePlugin`: may this plugin register?
    fn validate(&self, name: &str, endpoint: &str, versions: &[String]) -> Result<(), String>;
    /// `RegisterPlugin`: connect to the plugin at `endpoint`.
    fn register<'a>(
        &'a self,
        name: &'a str,
        endpoint: &'a str,
        versions: &'a [String],
    ) -> BoxFuture<'a, Result<(), String>>;
    /// `DeRegisterPlugin`: the plugin's socket is gone.
    fn deregister(&self, name: &str, endpoint: &str);
}

/// Handlers by plugin type.
pub type Handlers = BTreeMap<String, Arc<dyn PluginHandler>>;

/// Starts the plugin manager on `<root>/plugins_registry` with `handlers`;
/// it runs until `stop`.
pub fn start(
    root_dir: &std::path::Path,
    handlers: Handlers,
    stop: CancellationToken,
) -> Result<(), std::io::Error> {
    let dir: PathBuf = root_dir.join(REGISTRY_DIR_NAME);
    let desired = registry::DesiredState::default();
    watcher::start(&dir, desired.clone(), stop.clone())?;
    registry::start(desired, Arc::new(handlers), stop);
    Ok(())
}
