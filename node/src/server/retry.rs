//! The retry policy of kubelet's TokenReview and SubjectAccessReview
//! webhooks (`genericoptions.DefaultAuthWebhookRetryBackoff`: 500 ms,
//! factor 1.5, jitter 0.2, 5 steps; `webhook.DefaultShouldRetry`: transport
//! errors, 429 and 5xx are retried, other answers are final).

use std::future::Future;
use std::time::Duration;

/// Why a review could not be had.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// The API answered with an error or could not be reached.
    #[error(transparent)]
    Api(#[from] kube::Error),
    /// No answer within the request timeout.
    #[error("request timed out")]
    Timeout,
}

impl WebhookError {
    fn retryable(&self) -> bool {
        match self {
            WebhookError::Timeout => true,
            WebhookError::Api(kube::Error::Api(s)) => s.code == 429 || s.code >= 500,
            WebhookError::Api(kube::Error::SerdeError(_)) => false,
            WebhookError::Api(_) => true,
        }
    }
}

/// Runs `call` until it succeeds, fails for good or 5 tries are spent.
pub async fn with_webhook_backoff<T, F, Fut>(what: &str, mut call: F) -> Result<T, WebhookError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, WebhookError>>,
{
    let mut delay = Duration::from_millis(500);
    let mut attempt = 1;
    loop {
        match call().await {
            Ok(v) => return Ok(v),
            Err(e) if attempt < 5 && e.retryable() => {
                tracing::debug!(review = what, attempt, error = %e, "retrying");
                let jitter = delay.mul_f64(rand::random::<f64>() * 0.2);
                tokio::time::sleep(delay + jitter).await;
                delay = delay.mul_f64(1.5);
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}
