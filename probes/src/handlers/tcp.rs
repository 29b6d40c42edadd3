//! The `tcpSocket` probe: success when a TCP connection to the target opens
//! within the timeout (upstream `pkg/probe/tcp`).

use std::time::Duration;

use super::dial::{dial, timeout_text};
use crate::result::ProbeResult;

/// Connects to `host:port` and closes the connection at once.
pub async fn probe_tcp(host: &str, port: u16, timeout: Duration) -> ProbeResult {
    match tokio::time::timeout(timeout, dial(host, port)).await {
        Ok(Ok(stream)) => {
            drop(stream);
            ProbeResult::Success
        }
        Ok(Err(e)) => ProbeResult::Failure(e.to_string()),
        Err(_) => ProbeResult::Failure(timeout_text(host, port)),
    }
}
