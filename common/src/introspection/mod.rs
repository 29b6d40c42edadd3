//! The daemon's read-only introspection surface for `keelson diagnose`:
//! what only the running daemon knows (probe results, back-off timers, the
//! PLEG, Lease renewals and API latency from its own request log, the
//! Service model it programmed, the Events and API writes it made), served
//! as JSON on a Unix socket that only root can open.
//!
//! - [`Introspection`] is shared by the process: a [`Timeline`], an
//!   [`ApiLog`] (a tower layer on each role's client), and one provider per
//!   role ([`NodeIntrospect`], [`ProxyIntrospect`]), registered by the role
//!   when it starts. Providers read their subsystem's state through narrow
//!   accessors; nothing here can change it.
//! - [`server`] serves it: `GET` only, every other method is refused.
//! - [`types`] are the JSON bodies, shared with the CLI side
//!   (`keelson::diagnose`).

pub mod api_log;
pub mod server;
pub mod timeline;
pub mod types;

use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

pub use api_log::{ApiLog, CallKind};
pub use timeline::{Filter, ObjectKey, Timeline};

/// What the node role answers.
pub trait NodeIntrospect: Send + Sync {
    /// The node's own health.
    fn node(&self) -> types::NodeState;
    /// A pod the node holds, by namespace and name (`None`: unknown here).
    fn pod(&self, namespace: &str, name: &str) -> Option<types::PodState>;
}

/// What the proxy role answers.
pub trait ProxyIntrospect: Send + Sync {
    /// What was programmed for a Service.
    fn service(&self, namespace: &str, name: &str) -> types::ServiceState;
    /// `proxy.mode` in effect (`nftables`, `ebpf`).
    fn mode(&self) -> String;
}

struct Inner {
    started: SystemTime,
    node_name: String,
    timeline: Timeline,
    api_log: ApiLog,
    node: OnceLock<Arc<dyn NodeIntrospect>>,
    proxy: OnceLock<Arc<dyn ProxyIntrospect>>,
    started_with: OnceLock<types::StartedWith>,
}

/// The process's introspection state; cheap to clone.
#[derive(Clone)]
pub struct Introspection {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Introspection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Introspection")
            .field("node_name", &self.inner.node_name)
            .field("records", &self.inner.timeline.len())
            .finish_non_exhaustive()
    }
}

impl Default for Introspection {
    fn default() -> Self {
        Introspection::new("")
    }
}

impl Introspection {
    /// Empty state for the daemon of node `node_name`.
    pub fn new(node_name: &str) -> Introspection {
        let timeline = Timeline::default();
        Introspection {
            inner: Arc::new(Inner {
                started: SystemTime::now(),
                node_name: node_name.to_string(),
                api_log: ApiLog::new(Some(timeline.clone())),
                timeline,
                node: OnceLock::new(),
                proxy: OnceLock::new(),
                started_with: OnceLock::new(),
            }),
        }
    }

    /// The timeline (recorded Events, API writes).
    pub fn timeline(&self) -> &Timeline {
        &self.inner.timeline
    }

    /// The API request log.
    pub fn api_log(&self) -> &ApiLog {
        &self.inner.api_log
    }

    /// Registers the node role's provider (the first one wins).
    pub fn set_node(&self, p: Arc<dyn NodeIntrospect>) {
        let _ = self.inner.node.set(p);
    }

    /// Registers the proxy role's provider (the first one wins).
    pub fn set_proxy(&self, p: Arc<dyn ProxyIntrospect>) {
        let _ = self.inner.proxy.set(p);
    }

    /// Records what the daemon was started with (the first call wins).
    pub fn set_started_with(&self, s: types::StartedWith) {
        let _ = self.inner.started_with.set(s);
    }

    /// The node role's provider, once registered.
    pub fn node(&self) -> Option<&Arc<dyn NodeIntrospect>> {
        self.inner.node.get()
    }

    /// The proxy role's provider, once registered.
    pub fn proxy(&self) -> Option<&Arc<dyn ProxyIntrospect>> {
        self.inner.proxy.get()
    }

    /// `GET /v1/info`.
    pub fn info(&self) -> types::DaemonInfo {
        let mut roles = Vec::new();
        if self.node().is_some() {
            roles.push("node".to_string());
        }
        if self.proxy().is_some() {
            roles.push("proxy".to_string());
        }
        types::DaemonInfo {
            version: crate::version::KEELSON_VERSION.to_string(),
            kubernetes_version: crate::version::KUBERNETES_VERSION.to_string(),
            node_name: self.inner.node_name.clone(),
            pid: std::process::id(),
            started_at: timeline::rfc3339(self.inner.started),
            roles,
            proxy_mode: self.proxy().map(|p| p.mode()),
            started_with: self.inner.started_with.get().cloned(),
        }
    }
}
