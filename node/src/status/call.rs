//! A CRI or API call of the node status manager, bounded in time, and
//! why it failed (also what the images setter is given).

use std::time::Duration;

use keelson_common::error_chain::error_chain;

/// Why a bounded call (CRI or API) failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallError {
    /// The call failed (its error and causes, as one line).
    #[error("{0}")]
    Failed(String),
    /// No answer within the limit.
    #[error("request timed out after {0:?}")]
    TimedOut(Duration),
}

pub(crate) async fn bounded<T, E, F>(limit: Duration, fut: F) -> Result<T, CallError>
where
    F: std::future::Future<Output = Result<T, E>>,
    E: std::error::Error + 'static,
{
    match tokio::time::timeout(limit, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(CallError::Failed(error_chain(&e))),
        Err(_) => Err(CallError::TimedOut(limit)),
    }
}
