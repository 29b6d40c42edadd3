//! Container runtime health, as kubelet's `runtimeState` and its
//! `updateRuntimeUp` loop keep it: every 5 s CRI `Status` is asked for the
//! RuntimeReady and NetworkReady conditions; the answers become the errors
//! the Ready condition reports (`container runtime not ready: RuntimeReady=false
//! reason:... message:...`, `container runtime network not ready: ...`), and
//! a runtime that stops answering for 30 s is reported as `container runtime
//! is down`. Other parts of the node add named health checks (the PLEG's),
//! reported as `<name> is not healthy: <reason>`.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use keelson_common::observability::CheckFailed;
use keelson_cri::{NETWORK_READY, RUNTIME_READY, RuntimeClient, api, runtime_condition};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How often CRI Status is asked (kubelet: `updateRuntimeUp` every 5 s).
pub const RUNTIME_STATUS_PERIOD: Duration = Duration::from_secs(5);
/// How long without a successful Status before the runtime counts as down
/// (kubelet's `maxWaitForContainerRuntime`).
pub const MAX_WAIT_FOR_CONTAINER_RUNTIME: Duration = Duration::from_secs(30);

type CheckFn = Arc<dyn Fn() -> Result<(), CheckFailed> + Send + Sync>;

/// A runtime handler the runtime offers and its features.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeHandler {
    /// Handler name (empty for the default handler).
    pub name: String,
    /// Recursive read-only mounts supported.
    pub recursive_read_only_mounts: bool,
    /// User namespaces supported.
    pub user_namespaces: bool,
}

struct Inner {
    last_base_runtime_sync: Option<Instant>,
    threshold: Duration,
    runtime_error: Option<String>,
    network_error: Option<String>,
    storage_error: Option<String>,
    health_checks: Vec<(String, CheckFn)>,
    handlers: Vec<RuntimeHandler>,
    supplemental_groups_policy: Option<bool>,
}

/// The runtime's health as the node sees it; cheap to clone.
#[derive(Clone)]
pub struct RuntimeState {
    inner: Arc<Mutex<Inner>>,
    up: watch::Sender<bool>,
}

impl std::fmt::Debug for RuntimeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeState").finish_non_exhaustive()
    }
}

impl Default for RuntimeState {
    fn default() -> Self {
        Self::new(MAX_WAIT_FOR_CONTAINER_RUNTIME)
    }
}

impl RuntimeState {
    /// A state with no successful Status yet; the runtime counts as down
    /// when the last successful Status is older than `threshold`.
    pub fn new(threshold: Duration) -> Self {
        RuntimeState {
            inner: Arc::new(Mutex::new(Inner {
                last_base_runtime_sync: None,
                threshold,
                runtime_error: None,
                network_error: None,
                storage_error: None,
                health_checks: Vec::new(),
                handlers: Vec::new(),
                supplemental_groups_policy: None,
            })),
            up: watch::channel(false).0,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a named health check; a failing check makes the node NotReady
    /// with `<name> is not healthy: <reason>` (e.g. `PLEG`).
    pub fn add_health_check<F, E>(&self, name: &str, check: F)
    where
        F: Fn() -> Result<(), E> + Send + Sync + 'static,
        E: std::fmt::Display,
    {
        let mut inner = self.lock();
        inner.health_checks.retain(|(n, _)| n != name);
        inner.health_checks.push((
            name.to_string(),
            Arc::new(move || check().map_err(|e| CheckFailed(e.to_string()))),
        ));
    }

    /// Records a successful runtime status check at `now`.
    pub fn set_runtime_sync(&self, now: Instant) {
        self.lock().last_base_runtime_sync = Some(now);
        self.up.send_replace(true);
    }

    /// Sets (or clears) the runtime's own error.
    pub fn set_runtime_state(&self, error: Option<String>) {
        self.lock().runtime_error = error;
    }

    /// Sets (or clears) the network error.
    pub fn set_network_state(&self, error: Option<String>) {
        self.lock().network_error = error;
    }

    /// Sets (or clears) the storage error.
    pub fn set_storage_state(&self, error: Option<String>) {
        self.lock().storage_error = error;
    }

    /// Records the runtime handlers the runtime offers.
    pub fn set_runtime_handlers(&self, handlers: Vec<RuntimeHandler>) {
        self.lock().handlers = handlers;
    }

    /// Records the runtime features (`None`: the runtime reports none).
    pub fn set_supplemental_groups_policy(&self, supported: Option<bool>) {
        self.lock().supplemental_groups_policy = supported;
    }

    /// The runtime handlers last reported.
    pub fn runtime_handlers(&self) -> Vec<RuntimeHandler> {
        self.lock().handlers.clone()
    }

    /// Whether the runtime supports `supplementalGroupsPolicy`, if it said.
    pub fn supplemental_groups_policy(&self) -> Option<bool> {
        self.lock().supplemental_groups_policy
    }

    /// Errors about the runtime itself, at `now`.
    pub fn runtime_errors_at(&self, now: Instant) -> Vec<String> {
        let (mut errs, checks, runtime_error) = {
            let inner = self.lock();
            let mut errs = Vec::new();
            match inner.last_base_runtime_sync {
                None => errs
                    .push("container runtime status check may not have completed yet".to_string()),
                Some(t) if t + inner.threshold <= now => {
                    errs.push("container runtime is down".to_string())
                }
                Some(_) => {}
            }
            (
                errs,
                inner.health_checks.clone(),
                inner.runtime_error.clone(),
            )
        };
        // Checks run without the lock: they may take their own locks.
        for (name, check) in checks {
            if let Err(e) = check() {
                errs.push(format!("{name} is not healthy: {e}"));
            }
        }
        errs.extend(runtime_error);
        errs
    }

    /// Errors about the runtime itself, now.
    pub fn runtime_errors(&self) -> Vec<String> {
        self.runtime_errors_at(Instant::now())
    }

    /// Errors about the pod network.
    pub fn network_errors(&self) -> Vec<String> {
        self.lock().network_error.iter().cloned().collect()
    }

    /// Errors about storage.
    pub fn storage_errors(&self) -> Vec<String> {
        self.lock().storage_error.iter().cloned().collect()
    }

    /// Resolves once the runtime has answered Status with RuntimeReady at
    /// least once (kubelet starts its runtime-dependent modules then).
    pub async fn wait_runtime_up(&self) {
        let mut rx = self.up.subscribe();
        let _ = rx.wait_for(|up| *up).await;
    }

    /// Whether the runtime has been up at least once.
    pub fn has_been_up(&self) -> bool {
        *self.up.borrow()
    }
}

/// kubelet's `RuntimeCondition.String()`: `NetworkReady=false reason:X message:Y`,
/// or `<nil>` for a missing condition.
pub fn condition_text(c: Option<&api::RuntimeCondition>) -> String {
    match c {
        None => "<nil>".to_string(),
        Some(c) => format!(
            "{}={} reason:{} message:{}",
            c.r#type, c.status, c.reason, c.message
        ),
    }
}

/// What one Status answer means for the runtime state.
pub fn apply_status(state: &RuntimeState, response: &api::StatusResponse, now: Instant) {
    let Some(status) = response.status.as_ref() else {
        tracing::error!("container runtime status is nil");
        return;
    };
    let network = runtime_condition(status, NETWORK_READY);
    if network.is_some_and(|c| c.status) {
        state.set_network_state(None);
    } else {
        let text = condition_text(network);
        tracing::debug!(network_ready = %text, "container runtime network not ready");
        state.set_network_state(Some(format!("container runtime network not ready: {text}")));
    }
    let runtime = runtime_condition(status, RUNTIME_READY);
    if !runtime.is_some_and(|c| c.status) {
        let text = condition_text(runtime);
        tracing::warn!(runtime_ready = %text, "container runtime not ready");
        state.set_runtime_state(Some(format!("container runtime not ready: {text}")));
        return;
    }
    state.set_runtime_state(None);
    state.set_runtime_handlers(
        response
            .runtime_handlers
            .iter()
            .map(|h| RuntimeHandler {
                name: h.name.clone(),
                recursive_read_only_mounts: h
                    .features
                    .as_ref()
                    .is_some_and(|f| f.recursive_read_only_mounts),
                user_namespaces: h.features.as_ref().is_some_and(|f| f.user_namespaces),
            })
            .collect(),
    );
    state.set_supplemental_groups_policy(
        response
            .features
            .as_ref()
            .map(|f| f.supplemental_groups_policy),
    );
    state.set_runtime_sync(now);
}

/// One round of kubelet's `updateRuntimeUp`: ask Status, update the state.
/// A failed call changes nothing (the state ages into "runtime is down").
pub async fn update_runtime_up(cri: &RuntimeClient, state: &RuntimeState) {
    match cri.status_verbose(false).await {
        Ok(response) => apply_status(state, &response, Instant::now()),
        Err(e) => tracing::warn!(error = %e, "container runtime sanity check failed"),
    }
}

/// Runs [`update_runtime_up`] every `period` until `shutdown`.
pub async fn run_monitor(
    cri: RuntimeClient,
    state: RuntimeState,
    period: Duration,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => update_runtime_up(&cri, &state).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cond(kind: &str, ok: bool, reason: &str, message: &str) -> api::RuntimeCondition {
        api::RuntimeCondition {
            r#type: kind.to_string(),
            status: ok,
            reason: reason.to_string(),
            message: message.to_string(),
        }
    }

    fn response(conds: Vec<api::RuntimeCondition>) -> api::StatusResponse {
        api::StatusResponse {
            status: Some(api::RuntimeStatus { conditions: conds }),
            ..Default::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn states_follow_kubelet() {
        let s = RuntimeState::default();
        assert_eq!(
            s.runtime_errors(),
            vec!["container runtime status check may not have completed yet"]
        );
        let t0 = Instant::now();
        apply_status(
            &s,
            &response(vec![
                cond(RUNTIME_READY, true, "", ""),
                cond(
                    NETWORK_READY,
                    false,
                    "NetworkPluginNotReady",
                    "Network plugin returns error: cni plugin not initialized",
                ),
            ]),
            t0,
        );
        assert!(s.runtime_errors_at(t0).is_empty());
        assert_eq!(
            s.network_errors(),
            vec![
                "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized"
            ]
        );
        // No successful status for 30 s: down.
        assert_eq!(
            s.runtime_errors_at(t0 + MAX_WAIT_FOR_CONTAINER_RUNTIME),
            vec!["container runtime is down"]
        );
        // RuntimeReady false: the runtime's reason, and the sync time is not refreshed.
        apply_status(
            &s,
            &response(vec![cond(RUNTIME_READY, false, "Broken", "it broke")]),
            t0 + Duration::from_secs(5),
        );
        assert_eq!(
            s.runtime_errors_at(t0 + Duration::from_secs(6)),
            vec!["container runtime not ready: RuntimeReady=false reason:Broken message:it broke"]
        );
        assert_eq!(
            s.network_errors(),
            vec!["container runtime network not ready: <nil>"]
        );
        s.add_health_check("PLEG", || {
            Err("pleg was last seen active 3m0s ago; threshold is 3m0s".to_string())
        });
        let errs = s.runtime_errors_at(t0 + Duration::from_secs(6));
        assert_eq!(
            errs,
            vec![
                "PLEG is not healthy: pleg was last seen active 3m0s ago; threshold is 3m0s",
                "container runtime not ready: RuntimeReady=false reason:Broken message:it broke"
            ]
        );
    }

    #[tokio::test]
    async fn wait_runtime_up_resolves_on_first_sync() {
        let s = RuntimeState::default();
        assert!(!s.has_been_up());
        let s2 = s.clone();
        let waiter = tokio::spawn(async move { s2.wait_runtime_up().await });
        s.set_runtime_sync(Instant::now());
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("resolved")
            .expect("joined");
        assert!(s.has_been_up());
    }
}
