//! Process lifecycle: SIGTERM/SIGINT become a cancellation token, and the
//! systemd notification protocol (`Type=notify`) is spoken when systemd
//! asked for it (`$NOTIFY_SOCKET` set).

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

static STARTED: OnceLock<Instant> = OnceLock::new();

/// Marks the process's start (call first thing in `main`); later calls do
/// nothing.
pub fn mark_started() {
    STARTED.get_or_init(Instant::now);
}

/// Time since [`mark_started`] (zero if it was never called): start-up
/// phases are logged with it (`since_start_ms`).
pub fn since_start() -> Duration {
    STARTED.get().map(Instant::elapsed).unwrap_or_default()
}

/// [`since_start`] in milliseconds, for log fields.
pub fn since_start_ms() -> u64 {
    u64::try_from(since_start().as_millis()).unwrap_or(u64::MAX)
}

/// Cancels `token` on the first SIGTERM or SIGINT. A second signal exits
/// the process at once (an operator insisting).
pub fn cancel_on_signals(token: CancellationToken) -> std::io::Result<()> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!(signal = name, "shutting down");
        token.cancel();
        tokio::select! {
            _ = term.recv() => {},
            _ = int.recv() => {},
        }
        tracing::warn!("second signal: exiting immediately");
        std::process::exit(130);
    });
    Ok(())
}

/// Tells systemd the service is ready (no-op outside systemd).
pub fn notify_ready() {
    notify(&[sd_notify::NotifyState::Ready]);
}

/// Tells systemd the service is stopping (no-op outside systemd).
pub fn notify_stopping() {
    notify(&[sd_notify::NotifyState::Stopping]);
}

/// Sends a free-form status line to systemd (`systemctl status` shows it).
pub fn notify_status(text: &str) {
    notify(&[sd_notify::NotifyState::Status(text)]);
}

fn notify(state: &[sd_notify::NotifyState<'_>]) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    if let Err(e) = sd_notify::notify(state) {
        tracing::warn!(error = %e, "sd_notify failed");
    }
}

/// Sets this process's OOM score adjustment (kubelet's and kube-proxy's
/// `oomScoreAdj`, applied to themselves at start). Lowering it needs
/// CAP_SYS_RESOURCE; like kubelet, a refused write is logged and keelson
/// goes on.
pub fn apply_oom_score_adj(value: i32) {
    let path = "/proc/self/oom_score_adj";
    let current = std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok());
    if current == Some(value) {
        return;
    }
    match std::fs::write(path, value.to_string()) {
        Ok(()) => tracing::info!(oom_score_adj = value, "applied oomScoreAdj"),
        Err(e) => tracing::warn!(
            oom_score_adj = value,
            error = %e,
            "failed to apply oomScoreAdj (lowering it needs CAP_SYS_RESOURCE); keeping {}",
            current.map(|c| c.to_string()).unwrap_or_else(|| "the current value".into())
        ),
    }
}
