//! CRI endpoints: parsing `unix:///path` and building a tonic channel whose
//! connector dials that unix socket.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::error::CriError;

/// Largest gRPC message sent or accepted, as kubelet's CRI client (16 MiB):
/// ListContainers on a busy node exceeds tonic's 4 MiB default.
pub const MAX_MESSAGE_SIZE: usize = 16 * 1024 * 1024;

/// Turns a CRI endpoint into a socket path. Accepts `unix:///abs/path` (the
/// form kubelet's `containerRuntimeEndpoint` uses) and, like kubelet, a bare
/// absolute path.
pub fn socket_path(endpoint: &str) -> Result<PathBuf, CriError> {
    let invalid = |reason| CriError::InvalidEndpoint {
        endpoint: endpoint.to_string(),
        reason,
    };
    let path = if let Some(rest) = endpoint.strip_prefix("unix://") {
        rest
    } else if endpoint.contains("://") {
        return Err(invalid("only unix:// endpoints are supported"));
    } else {
        endpoint
    };
    if path.is_empty() {
        return Err(invalid("the socket path is empty"));
    }
    if !Path::new(path).is_absolute() {
        return Err(invalid("the socket path must be absolute (unix:///path)"));
    }
    Ok(PathBuf::from(path))
}

/// A channel that dials `path` on first use and again after the connection
/// breaks (tonic's channel reconnects on the next call), so a runtime
/// restart costs the calls made while it is down, nothing more.
pub(crate) fn lazy_channel(path: PathBuf, connect_timeout: Duration) -> Channel {
    let path = Arc::new(path);
    // The authority is never used on a unix socket; tonic needs a valid URI.
    Endpoint::from_static("http://cri.invalid")
        .connect_timeout(connect_timeout)
        .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
            let path = Arc::clone(&path);
            async move {
                let stream = UnixStream::connect(path.as_path()).await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_unix_urls_and_bare_paths() {
        assert_eq!(
            socket_path("unix:///run/containerd/containerd.sock").ok(),
            Some(PathBuf::from("/run/containerd/containerd.sock"))
        );
        assert_eq!(
            socket_path("/run/x.sock").ok(),
            Some(PathBuf::from("/run/x.sock"))
        );
    }

    #[test]
    fn rejects_other_schemes_and_relative_paths() {
        for bad in [
            "tcp://1.2.3.4:1",
            "unix://",
            "unix://rel/x.sock",
            "x.sock",
            "",
        ] {
            let err = socket_path(bad).expect_err(bad);
            assert!(
                matches!(err, CriError::InvalidEndpoint { .. }),
                "{bad}: {err}"
            );
            assert!(err.to_string().contains("invalid CRI endpoint"), "{err}");
        }
    }
}
