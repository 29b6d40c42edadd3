//! Process lifecycle: SIGTERM/SIGINT become a cancellation token, and the
//! systemd notification protocol (`Type=notify`) is spoken when systemd
//! asked for it (`$NOTIFY_SOCKET` set).

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

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
