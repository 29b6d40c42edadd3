//! Why a round of statistics could not be taken: the node API answers it
//! as kubelet does when its summary provider fails (500, `Internal Error:
//! <message>`) and the eviction manager skips its round.

use keelson_cri::CriError;

/// A failed statistics round.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StatsError {
    /// The runtime did not list its ready sandboxes.
    #[error("failed to list pod sandboxes: {0}")]
    ListSandboxes(CriError),
    /// The runtime did not list its running containers.
    #[error("failed to list containers: {0}")]
    ListContainers(CriError),
    /// The round's file reads did not finish (the blocking task ended
    /// abnormally).
    #[error("stats collection failed: {0}")]
    Interrupted(String),
    /// No round has been taken (the cache is going away).
    #[error("statistics are not collected")]
    NotCollected,
}
