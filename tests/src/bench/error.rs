//! What can go wrong while setting up or running the benchmark.

use crate::netns::NetNsError;

/// A benchmark failure, naming what was being done.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Creating or using a network namespace failed.
    #[error(transparent)]
    NetNs(#[from] NetNsError),
    /// A file or process operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What we were doing.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// An API request failed.
    #[error("{context}: {source}")]
    Api {
        /// What we were doing.
        context: String,
        /// The client's error.
        #[source]
        source: Box<kube::Error>,
    },
    /// The probe agent failed or answered something unexpected.
    #[error("probe agent: {0}")]
    Agent(String),
    /// A contestant could not be started or stopped.
    #[error("contestant {name}: {message}")]
    Contestant {
        /// The contestant's label.
        name: String,
        /// What happened.
        message: String,
    },
    /// A setting or input is unusable.
    #[error("{0}")]
    Invalid(String),
}

impl BenchError {
    /// An I/O error with context.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> BenchError {
        BenchError::Io {
            context: context.into(),
            source,
        }
    }

    /// An API error with context.
    pub fn api(context: impl Into<String>, source: kube::Error) -> BenchError {
        BenchError::Api {
            context: context.into(),
            source: Box::new(source),
        }
    }
}

/// Result of benchmark operations.
pub type Result<T, E = BenchError> = std::result::Result<T, E>;
